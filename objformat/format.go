package objformat

import (
	"encoding/binary"
	"hash/crc32"
)

// Format constants. All integers are big-endian; every checksum is CRC32C
// (Castagnoli), unmasked.
const (
	// Magic opens the header and closes the footer: "WDOB".
	Magic uint32 = 0x57444F42
	// Version is the format version this package writes and reads.
	Version uint16 = 1

	// HeaderSize is the size of the object header.
	HeaderSize = 16
	// BatchHeaderSize is the size of a batch header inside a section.
	BatchHeaderSize = 16
	// IndexHeaderSize is the size of the index's leading entry count.
	IndexHeaderSize = 4
	// IndexEntrySize is the size of one index entry.
	IndexEntrySize = 56
	// FooterSize is the size of the fixed footer at the end of the object.
	FooterSize = 32

	// MaxPayload is the largest batch payload accepted (matches the u32
	// length field and keeps a damaged length from asking for more memory
	// than the object holds).
	MaxPayload = 1<<31 - 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC32C (Castagnoli) of b, the checksum used throughout
// the format and sent to S3.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

func crcUpdate(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

var be = binary.BigEndian

// IndexEntry describes one stream's section inside an object. Its fields
// are those of the catalog's ObjectRange plus the batch count and the
// section checksum.
type IndexEntry struct {
	// StreamID identifies the stream.
	StreamID uint64
	// StreamEpoch is the stream epoch of every batch in the section.
	StreamEpoch uint64
	// StartOffset is the base offset of the section's first batch.
	StartOffset uint64
	// EndOffset is one past the last offset of the section's last batch.
	EndOffset uint64
	// Position is the byte offset of the section inside the object.
	Position uint64
	// Length is the section's size in bytes.
	Length uint64
	// BatchCount is the number of batches in the section.
	BatchCount uint32
	// CRC32C is the checksum of the section's bytes.
	CRC32C uint32
}

// Index is the decoded index of an object.
type Index struct {
	// Version is the object's format version.
	Version uint16
	// Size is the object's total size in bytes.
	Size int64
	// Entries lists the sections in the order they appear in the object
	// (ascending stream id).
	Entries []IndexEntry
}

// Entry returns the index entry of a stream.
func (ix *Index) Entry(streamID uint64) (IndexEntry, bool) {
	for _, e := range ix.Entries {
		if e.StreamID == streamID {
			return e, true
		}
	}
	return IndexEntry{}, false
}

func encodeHeader(b []byte) {
	be.PutUint32(b[0:], Magic)
	be.PutUint16(b[4:], Version)
	be.PutUint16(b[6:], 0) // flags
	be.PutUint32(b[8:], 0) // reserved
	be.PutUint32(b[12:], CRC32C(b[0:12]))
}

func encodeIndexEntry(b []byte, e IndexEntry) {
	be.PutUint64(b[0:], e.StreamID)
	be.PutUint64(b[8:], e.StreamEpoch)
	be.PutUint64(b[16:], e.StartOffset)
	be.PutUint64(b[24:], e.EndOffset)
	be.PutUint64(b[32:], e.Position)
	be.PutUint64(b[40:], e.Length)
	be.PutUint32(b[48:], e.BatchCount)
	be.PutUint32(b[52:], e.CRC32C)
}

func decodeIndexEntry(b []byte) IndexEntry {
	return IndexEntry{
		StreamID:    be.Uint64(b[0:]),
		StreamEpoch: be.Uint64(b[8:]),
		StartOffset: be.Uint64(b[16:]),
		EndOffset:   be.Uint64(b[24:]),
		Position:    be.Uint64(b[32:]),
		Length:      be.Uint64(b[40:]),
		BatchCount:  be.Uint32(b[48:]),
		CRC32C:      be.Uint32(b[52:]),
	}
}

func encodeFooter(b []byte, indexPos, indexLen uint64, indexCRC uint32) {
	be.PutUint64(b[0:], indexPos)
	be.PutUint64(b[8:], indexLen)
	be.PutUint32(b[16:], indexCRC)
	be.PutUint16(b[20:], Version)
	be.PutUint16(b[22:], 0) // reserved
	be.PutUint32(b[24:], CRC32C(b[0:24]))
	be.PutUint32(b[28:], Magic)
}
