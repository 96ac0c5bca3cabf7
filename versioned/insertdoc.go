package versioned

import (
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// withMeta returns the encoded document raw with the write-id subdocument
// of a new incarnation appended as field meta: {inc: wid, ids: [wid]}. It
// builds the bytes directly: Insert sends them as they are, with no
// element-by-element copy for the driver to marshal again.
func withMeta(raw bson.Raw, meta string, wid int64) bson.Raw {
	out := make([]byte, 0, len(raw)+len(meta)+48)
	out = append(out, raw[:len(raw)-1]...)
	out, sub := openDoc(out, []byte(meta))
	out = bsoncore.AppendInt64Element(out, metaInc, wid)
	arr, out := bsoncore.AppendArrayElementStart(out, metaIDs)
	out = appendIDElement(out, 0, wid)
	out, _ = bsoncore.AppendArrayEnd(out, arr)
	out = closeDoc(out, sub)
	return closeDoc(out, 0)
}
