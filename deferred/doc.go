// Package deferred is a durable queue of deferred changes in MongoDB: when a
// change cannot be applied now (its retries ran out in a conflict storm),
// hand it to the queue, answer the caller "accepted", and apply it later,
// exactly once. It needs no infrastructure beyond the database the service
// already uses.
//
//	q, err := deferred.New(db.Collection("jobs"), nil)
//	// A named change to a versioned repository's documents:
//	spend, err := deferred.NewChange(q, "spend", wallets, func(w *Wallet, amount int64) error {
//		if w.Balance+amount < 0 {
//			return retry.Permanent(ErrInsufficient) // queued: dead at once
//		}
//		w.Balance += amount
//		return nil
//	})
//	go q.Run(ctx) // in every process that should work the queue
//
//	res, err := spend.ModifyOrEnqueue(ctx, "ana", -30)
//	switch {
//	case err != nil: // fn's error, not found, bad input: nothing queued
//	case res.Queued: // 202 Accepted, Location: /jobs/<res.JobID.Hex()>
//	default: // 200 OK with res.Doc
//	}
//
// Register gives any handler a name and a typed argument (Kind.Enqueue);
// NewChange is Register for a read-modify-write of a versioned document,
// whose job key is the document's id. RegisterRun is Register with a run
// function that takes a run of a key's jobs whole (GuardedRun: one write
// fenced for the whole run), as a Change run is. Queue.Job, Counts, Requeue, Cancel
// inspect and manage jobs; Queue.Wait polls one; Kind.Unfinished lists a
// kind's jobs that may still run.
//
// Each job has a key (usually the id of the document it changes). A worker
// of Run claims a whole key with a lease (renewed while it works) and runs
// the key's due jobs in sequence order, a run at a time: one read finds
// the run, one write claims and one records each job (a Change run's jobs,
// applied to their document in one read and one write, together; a run
// function's, together), one moves the key's head.
// A failed attempt is retried after a jittered backoff; after MaxAttempts,
// or at once for retry.Permanent, the job is dead and the key moves on. A
// process without the handler of a key's next job leaves the key to those
// that have it. Delivery is at least once; the effect is exactly once for a
// write conditioned on the job's fence that records its stamp in the same
// statement (Job.Fence, Job.Stamp), as Guarded, Modify and Change do.
// Options.Observer receives each job's events. DESIGN.md beside this file
// gives the protocol and why it is safe.
//
// # Guarantees
//
// Given MongoDB's single-document atomicity, unique indexes, and the lease
// package's guarantees (see its documentation):
//
//   - Per-key order: a job starts only after every job enqueued on its key
//     before it (whose Enqueue returned before its own began) has finished:
//     completed, dead or cancelled. At most one handler of a key runs with a
//     live context at any time; a worker that loses its claim has its
//     handler's context ended before another worker can claim the key.
//   - Exactly-once effect: a write made with Job.Fence and Job.Stamp (or by
//     Guarded, Modify, Change) applies at most once per job, however often the
//     job is delivered and however many other writes the document takes
//     meanwhile, and never after a later job of the key has applied. A job
//     changes each target document in one such write: a second Guarded or
//     Modify of the same document in one attempt is refused (ErrInvalid,
//     and the job is dead at once), never reported as applied. Requeue
//     refuses a job that may have applied its change (Job.MayHaveApplied),
//     since under a new sequence number it would apply again.
//     Delivery itself is at least once: side effects outside such a write may
//     repeat.
//   - A job is stored at most once per Enqueue that returns its id, where a
//     worker will run it, and an Enqueue that returns an error other than an
//     *UnknownOutcomeError stored nothing, nor can a copy of its writes still
//     in flight store it later. Likewise a Requeue that returns nil put the
//     job back in the queue, and one that returns another error than an
//     *UnknownOutcomeError changed nothing. Inside a transaction (ctx
//     carries a session with one in progress) Enqueue's writes take part in
//     it: they commit or abort with the caller's writes.
//   - A job is tried at most MaxAttempts times (an attempt whose worker was
//     lost counts; snoozes and attempts interrupted by Run's stop do not),
//     then dead with one recorded error per failed attempt (the newest
//     MaxErrors of them). A handler's error matching ErrInvalid makes the
//     job dead at once, as retry.Permanent does, and so does a stored
//     argument that does not decode into the handler's type (another
//     version of the program enqueued it). Each claim of a job has an id of
//     its own (Job.Claim), and every write that acts on the claimed job is
//     conditioned on it: a copy of a claim, record, snooze or put-back held
//     in the network that arrives after the job moved on changes nothing,
//     so a late copy never costs a job an attempt nor runs it twice.
//   - Bounded storage: a job keeps at most MaxErrors errors; the keys
//     collection holds a document per key only while the key has jobs or
//     was worked within Retention (Sweep deletes the others); a target
//     document carries one stamp (about 40 bytes) per queue and key whose
//     jobs wrote it (NewChange keys jobs by their document, so one).
//   - A handler's panic fails its attempt; the worker lives on.
//   - Bad input is refused before anything is written: keys are checked by
//     store.CheckID, handler names must be registered, arguments must be of
//     the handler's type, encode, and hold no field name a server could read
//     as an operator.
//   - A Queue is safe for concurrent use. Run's goroutines end before it
//     returns.
//
// # Errors
//
// Messages start with "deferred: "; errors of the versioned, lease and
// driver packages are wrapped with %w. Match with errors.Is and errors.As:
//
//   - ErrInvalid, *InvalidError: bad input, nothing stored; ErrInvalidID too
//     for a refused key. The same values as the store package's.
//   - ErrNotFound, *NotFoundError: no job has the id (Job, Requeue, Cancel).
//   - ErrState, *StateError: Requeue of a job that is not dead or cancelled,
//     or that may have applied its change (StateError.MayHaveApplied: check
//     its target documents, then Cancel it or enqueue what is missing);
//     Cancel of a running or finished job.
//   - ErrUnknownOutcome, *UnknownOutcomeError: an Enqueue, Requeue or
//     Cancel failed ambiguously and settling it could not tell whether it
//     took effect. Its ID (the job's) says what to look for later.
//   - A context that ended: the context's error, wrapped, never ErrInvalid,
//     and promptly, also while another call makes the indexes. A nil context
//     is ErrInvalid.
//   - From ModifyOrEnqueue: versioned's errors as Modify returns them (fn's
//     own, versioned.ErrNotFound, ...) when the change was not queued.
//   - In a job's recorded errors: the handler's error message, a
//     *PanicError's value and stack, or an *InvalidError (Op "run", Field
//     "args") naming the handler and the type its stored argument does not
//     decode into.
package deferred
