package observe

import (
	"context"
	"log/slog"
)

// Slog returns an Observer that logs each event to logger (slog.Default()
// if nil), with the message "mongocas " and the kind ("mongocas conflict")
// and the event's fields as attributes. Normal operation is quiet at Info:
//
//   - Warn, where someone must look: LeaseLost, OpEnd with OutcomeUnknown,
//     JobDead, QueueError, QueueKeySkipped, KeyMismatch.
//   - Info: OpEnd whose Outcome.Failed, BudgetRefused, LeaseRenewFailed,
//     Settled with SettledUnknown, JobFailed, MoveReturned.
//   - Debug: everything else (operations that start, or end well or with an
//     answer such as a conflict, and the events of normal work).
//
// An event below the logger's level costs one call of its Enabled method and
// allocates nothing; Start never changes the context.
func Slog(logger *slog.Logger) Observer {
	if logger == nil {
		logger = slog.Default()
	}
	return slogObserver{l: logger}
}

type slogObserver struct{ l *slog.Logger }

var slogMessages = func() (m [kindEnd]string) {
	for k := range kindEnd {
		m[k] = "mongocas " + k.String()
	}
	return m
}()

// slogLevel returns the level at which the slog Observer logs e.
func slogLevel(e Event) slog.Level {
	switch e.Kind {
	case LeaseLost, JobDead, QueueError, QueueKeySkipped, KeyMismatch:
		return slog.LevelWarn
	case JobFailed, BudgetRefused, LeaseRenewFailed, MoveReturned:
		return slog.LevelInfo
	case OpEnd:
		switch {
		case e.Outcome == OutcomeUnknown:
			return slog.LevelWarn
		case e.Outcome.Failed():
			return slog.LevelInfo
		}
	case Settled:
		if e.Settlement == SettledUnknown {
			return slog.LevelInfo
		}
	default:
	}
	return slog.LevelDebug
}

func (s slogObserver) Start(ctx context.Context, e Event) context.Context {
	s.Observe(ctx, e)
	return ctx
}

func (s slogObserver) Observe(ctx context.Context, e Event) {
	level := slogLevel(e)
	if !s.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 14)
	if e.Op != "" {
		attrs = append(attrs, slog.String("op", e.Op))
	}
	if e.Collection != "" {
		attrs = append(attrs, slog.String("db", e.Database), slog.String("collection", e.Collection))
	}
	if e.ID != nil {
		attrs = append(attrs, slog.Any("id", e.ID))
	}
	if e.Name != "" {
		attrs = append(attrs, slog.String("name", e.Name))
	}
	if e.Key != "" {
		attrs = append(attrs, slog.String("key", e.Key))
	}
	switch e.Kind {
	case OpEnd:
		attrs = append(attrs, slog.String("outcome", string(e.Outcome)), slog.Duration("elapsed", e.Elapsed))
		if e.Attempt > 0 {
			attrs = append(attrs, slog.Int("attempts", e.Attempt))
		}
	case Conflict:
		attrs = append(attrs, slog.Int64("expected", e.Expected), slog.Int64("current", e.Current))
	case Retry:
		attrs = append(attrs, slog.Int("attempt", e.Attempt), slog.Duration("delay", e.Delay))
	case BudgetRefused:
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
	case Settled:
		attrs = append(attrs, slog.String("settlement", e.Settlement.String()))
	case LeaseAcquired, LeaseRenewed, LeaseRenewFailed, LeaseLost, LeaseReleased:
		attrs = append(attrs, slog.Int64("epoch", e.Epoch), slog.String("owner", e.Owner))
		switch e.Kind {
		case LeaseAcquired:
			attrs = append(attrs, slog.Duration("wait", e.Wait))
		case LeaseRenewed:
			attrs = append(attrs, slog.Duration("time_left", e.TimeLeft))
		case LeaseLost:
			attrs = append(attrs, slog.String("reason", e.Reason), slog.Duration("held", e.Held))
			if e.Holder != "" {
				attrs = append(attrs, slog.String("holder", e.Holder))
			}
		case LeaseReleased:
			attrs = append(attrs, slog.Duration("held", e.Held))
		default:
		}
	case LeaseHeld, KeyInProgress:
		attrs = append(attrs, slog.String("holder", e.Holder), slog.Int64("epoch", e.Epoch), slog.Duration("time_left", e.TimeLeft))
	case ClockSync:
		attrs = append(attrs, slog.Duration("bound", e.Bound), slog.Duration("rtt", e.RTT))
	case JobClaimed:
		attrs = append(attrs, slog.Int("attempt", e.Attempt), slog.Duration("age", e.Age))
	case JobCompleted, JobFailed, JobDead, JobSnoozed:
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
		if e.Outcome != "" {
			attrs = append(attrs, slog.String("outcome", string(e.Outcome)))
		}
		attrs = append(attrs, slog.Duration("elapsed", e.Elapsed))
		if e.Kind == JobFailed || e.Kind == JobSnoozed {
			attrs = append(attrs, slog.Duration("delay", e.Delay))
		}
	case QueueKeySkipped:
		attrs = append(attrs, slog.String("reason", e.Reason))
	case KeyCompleted:
		attrs = append(attrs, slog.Int("attempt", e.Attempt), slog.Int64("epoch", e.Epoch))
	case MoveDebited, MoveDone, MoveReturned:
		attrs = append(attrs, slog.String("from", e.From), slog.String("to", e.To), slog.Int64("amount", e.Amount))
		if e.Kind != MoveDebited {
			attrs = append(attrs, slog.Duration("age", e.Age))
		}
	default:
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("err", e.Err))
	}
	msg := "mongocas"
	if e.Kind > 0 && e.Kind < kindEnd {
		msg = slogMessages[e.Kind]
	}
	s.l.LogAttrs(ctx, level, msg, attrs...)
}
