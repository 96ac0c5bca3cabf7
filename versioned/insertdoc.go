package versioned

import (
	"encoding/binary"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// withMeta returns the encoded document raw with the write-id subdocument
// of a new incarnation appended as field meta: {inc: wid, h: WriteIDs, ids:
// [wid]}. It builds the bytes directly: Insert sends them as they are, with
// no element-by-element copy for the driver to marshal again.
func withMeta(raw bson.Raw, meta, wid string) bson.Raw {
	sub := 4 + // the subdocument's length
		1 + len(metaInc) + 1 + 4 + len(wid) + 1 + // inc: wid
		1 + len(metaH) + 1 + 4 + // h: int32
		1 + len(metaIDs) + 1 + 4 + 1 + 2 + 4 + len(wid) + 1 + 1 + // ids: [wid]
		1 // end
	out := make([]byte, 0, len(raw)+1+len(meta)+1+sub)
	out = append(out, raw[:len(raw)-1]...)
	out = append(out, byte(bson.TypeEmbeddedDocument))
	out = append(out, meta...)
	out = append(out, 0)
	start := len(out)
	out = binary.LittleEndian.AppendUint32(out, 0) // fixed below
	out = appendString(out, metaInc, wid)
	out = append(out, byte(bson.TypeInt32))
	out = append(out, metaH...)
	out = append(out, 0)
	out = binary.LittleEndian.AppendUint32(out, WriteIDs)
	out = append(out, byte(bson.TypeArray))
	out = append(out, metaIDs...)
	out = append(out, 0)
	arr := len(out)
	out = binary.LittleEndian.AppendUint32(out, 0)
	out = appendIDElement(out, 0, []byte(wid))
	out = append(out, 0)
	binary.LittleEndian.PutUint32(out[arr:], uint32(len(out)-arr)) //nolint:gosec // a few dozen bytes
	out = append(out, 0)
	binary.LittleEndian.PutUint32(out[start:], uint32(len(out)-start)) //nolint:gosec // a few dozen bytes
	out = append(out, 0)
	binary.LittleEndian.PutUint32(out, uint32(len(out))) //nolint:gosec // encode checked the size
	return out
}

// appendString appends the string element key: s.
func appendString(buf []byte, key, s string) []byte {
	buf = append(buf, byte(bson.TypeString))
	buf = append(buf, key...)
	buf = append(buf, 0)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s)+1)) //nolint:gosec // an id of 26 characters
	buf = append(buf, s...)
	return append(buf, 0)
}
