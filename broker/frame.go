package broker

import (
	"encoding/binary"
	"fmt"
)

// EncodeRecords frames records into one batch payload: each record is a
// big-endian u32 length followed by its bytes.
func EncodeRecords(records [][]byte) []byte {
	n := 0
	for _, r := range records {
		n += 4 + len(r)
	}
	out := make([]byte, 0, n)
	for _, r := range records {
		out = binary.BigEndian.AppendUint32(out, uint32(len(r)))
		out = append(out, r...)
	}
	return out
}

// DecodeRecords splits a batch payload framed by EncodeRecords; it expects
// exactly count records. The returned slices alias payload.
func DecodeRecords(payload []byte, count uint32) ([][]byte, error) {
	out := make([][]byte, 0, count)
	for len(payload) > 0 {
		if len(payload) < 4 {
			return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorruptFrame, len(payload))
		}
		n := binary.BigEndian.Uint32(payload)
		if uint64(n) > uint64(len(payload)-4) {
			return nil, fmt.Errorf("%w: record of %d bytes, %d left", ErrCorruptFrame, n, len(payload)-4)
		}
		out = append(out, payload[4:4+n])
		payload = payload[4+n:]
	}
	if uint32(len(out)) != count {
		return nil, fmt.Errorf("%w: %d records, batch count %d", ErrCorruptFrame, len(out), count)
	}
	return out, nil
}
