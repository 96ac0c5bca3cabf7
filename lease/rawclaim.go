package lease

import (
	"encoding/binary"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A claim in ModeEstimated, encoded as bytes: the driver sends them as they
// are, instead of marshalling a tree of bson.D values built per claim.

// freeOrExpired is the filter value [{owner: null}, {expiresAt: {$lt:
// cutoff}}] (for $or): no owner, or a record expired before cutoff.
func (m *Manager) freeOrExpired(cutoff time.Time) bson.Raw {
	b := make([]byte, 4, 64+len(m.pOwner)+len(m.pExpires))
	var one, lt int
	b, one = openDoc(b, "0")
	b = append(b, byte(bson.TypeNull))
	b = append(b, m.pOwner...)
	b = append(b, 0)
	b = closeDoc(b, one)
	b, one = openDoc(b, "1")
	b, lt = openDoc(b, m.pExpires)
	b = appendDate(b, "$lt", cutoff)
	b = closeDoc(b, lt)
	b = closeDoc(b, one)
	return endDoc(b)
}

// estimatedUpdate is the update of a claim of attempt a in ModeEstimated:
// $set of the owner, the expiry, the acquisition time and the claim id, and
// $inc of the epoch.
func (m *Manager) estimatedUpdate(a attempt) bson.Raw {
	b := make([]byte, 4, 128+len(m.c.owner)+len(m.pOwner)+len(m.pExpires)+len(m.pAcquired)+len(m.pClaim)+len(m.pEpoch))
	var set, inc int
	b, set = openDoc(b, "$set")
	b = appendString(b, m.pOwner, m.c.owner)
	b = appendDate(b, m.pExpires, a.est.Time.Add(m.c.ttl))
	b = appendDate(b, m.pAcquired, a.est.Time)
	b = append(b, byte(bson.TypeObjectID))
	b = append(b, m.pClaim...)
	b = append(b, 0)
	b = append(b, a.claim[:]...)
	b = closeDoc(b, set)
	b, inc = openDoc(b, "$inc")
	b = append(b, byte(bson.TypeInt64))
	b = append(b, m.pEpoch...)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = closeDoc(b, inc)
	return endDoc(b)
}

// openDoc appends the header of an embedded document element key, and
// returns where its length goes.
func openDoc(b []byte, key string) ([]byte, int) {
	b = append(b, byte(bson.TypeEmbeddedDocument))
	b = append(b, key...)
	b = append(b, 0)
	start := len(b)
	return binary.LittleEndian.AppendUint32(b, 0), start
}

// closeDoc ends the embedded document whose length goes at start.
func closeDoc(b []byte, start int) []byte {
	b = append(b, 0)
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start)) //nolint:gosec // a short record
	return b
}

// endDoc ends the document b began with 4 bytes for its length.
func endDoc(b []byte) bson.Raw {
	b = append(b, 0)
	binary.LittleEndian.PutUint32(b, uint32(len(b))) //nolint:gosec // a short record
	return b
}

// appendDate appends key: t as a BSON date (milliseconds, as the driver
// stores a time.Time: truncated).
func appendDate(b []byte, key string, t time.Time) []byte {
	b = append(b, byte(bson.TypeDateTime))
	b = append(b, key...)
	b = append(b, 0)
	return binary.LittleEndian.AppendUint64(b, uint64(t.UnixMilli()))
}

// appendString appends key: s.
func appendString(b []byte, key, s string) []byte {
	b = append(b, byte(bson.TypeString))
	b = append(b, key...)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)+1)) //nolint:gosec // an owner string
	b = append(b, s...)
	return append(b, 0)
}
