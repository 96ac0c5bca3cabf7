package wireproxy

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// opMsg builds an OP_MSG with a body section and one document sequence.
func opMsgBytes(t testing.TB, flags uint32, body bson.D, seqID string, seq ...bson.D) []byte {
	t.Helper()
	msg := make([]byte, 16, 256)
	msg = binary.LittleEndian.AppendUint32(msg, flags)
	b, err := bson.Marshal(body)
	require.NoError(t, err)
	msg = append(msg, 0)
	msg = append(msg, b...)
	if seqID != "" {
		var docs []byte
		for _, d := range seq {
			db, err := bson.Marshal(d)
			require.NoError(t, err)
			docs = append(docs, db...)
		}
		msg = append(msg, 1)
		msg = binary.LittleEndian.AppendUint32(msg, uint32(4+len(seqID)+1+len(docs))) //nolint:gosec // test messages are tiny
		msg = append(msg, seqID...)
		msg = append(msg, 0)
		msg = append(msg, docs...)
	}
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg))) //nolint:gosec // test messages are tiny
	binary.LittleEndian.PutUint32(msg[12:], opMsg)
	return msg
}

func TestParseCommand(t *testing.T) {
	msg := opMsgBytes(t, 0,
		bson.D{{Key: "update", Value: "wallets"}, {Key: "ordered", Value: true}, {Key: "$db", Value: "bank"}},
		"updates",
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 1}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: 2}}}},
	)
	cmd := parseCommand(msg)
	require.Equal(t, "update", cmd.Name)
	require.Equal(t, "wallets", cmd.Collection)
	require.Equal(t, "bank", cmd.Database)
	require.Len(t, cmd.Sequences["updates"], 2)
	require.False(t, moreToCome(msg))

	more := opMsgBytes(t, flagMoreToCome, bson.D{{Key: "insert", Value: "c"}}, "")
	require.True(t, moreToCome(more))
	require.Equal(t, "insert", parseCommand(more).Name)
}

// FuzzParseCommand: whatever bytes arrive, parsing never panics and never
// reads past the message.
func FuzzParseCommand(f *testing.F) {
	f.Add(opMsgBytes(f, 0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "x"}}, ""))
	f.Add(opMsgBytes(f, 0, bson.D{{Key: "insert", Value: "c"}}, "documents", bson.D{{Key: "a", Value: 1}}))
	f.Add(opMsgBytes(f, flagChecksumPresent, bson.D{{Key: "ping", Value: 1}}, ""))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) < 16 {
			return
		}
		_ = parseCommand(msg)
		_ = moreToCome(msg)
	})
}
