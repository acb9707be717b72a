package wal

import (
	"encoding/binary"
	"hash/crc32"
	"sync"
)

// Format constants of AutoMQ's block WAL (s3stream BlockWALHeader,
// RecordHeader, WALUtil and StreamRecordBatchCodec on the 1.4 branch).
const (
	// BlockSize is the alignment of group-commit blocks and header slots.
	BlockSize = 4096
	// HeaderSlots is the number of header slots at the start of the device.
	HeaderSlots = 2
	// HeaderRegionSize is the space taken by both header slots; records live
	// after it.
	HeaderRegionSize = HeaderSlots * BlockSize
	// HeaderSize is the encoded size of one header slot's content.
	HeaderSize = 56
	// RecordHeaderSize is the encoded size of a record header.
	RecordHeaderSize = 24
	// BodyHeaderSize is the size of a stream record batch body before its
	// payload.
	BodyHeaderSize = 33

	// MagicV0 marks a version 0 header (AutoMQ 1.4.0 and 1.4.1).
	MagicV0 uint32 = 0x12345678
	// MagicV1 marks a version 1 header (padding records, V1 recovery).
	MagicV1 uint32 = 0x01234567
	// RecordMagicData marks a record header followed by a batch body.
	RecordMagicData uint32 = 0x87654321
	// RecordMagicPadding marks a padding record that runs to the end of the
	// device (version 1).
	RecordMagicPadding uint32 = 0x76543210
	// BodyMagic is the first byte of a stream record batch body.
	BodyMagic byte = 0x22

	// MinCapacity is the smallest capacity the package accepts: the header
	// slots plus one block.
	MinCapacity = HeaderRegionSize + BlockSize
)

// ShutdownType is the header's record of how the writer stopped.
type ShutdownType uint32

const (
	// ShutdownGraceful is written by Close after every block is durable.
	ShutdownGraceful ShutdownType = 0
	// ShutdownUngraceful is written while a writer has the WAL open.
	ShutdownUngraceful ShutdownType = 1
)

// String names the shutdown type as inspect prints it.
func (s ShutdownType) String() string {
	switch s {
	case ShutdownGraceful:
		return "graceful"
	case ShutdownUngraceful:
		return "ungraceful"
	default:
		return "unknown"
	}
}

// Header is the content of one header slot.
type Header struct {
	// Magic is MagicV0 or MagicV1.
	Magic uint32
	// Capacity is the size in bytes of the device region the WAL uses,
	// header slots included.
	Capacity uint64
	// TrimOffset is the logical offset of the last trimmed record (trimming
	// is inclusive); -1 on a WAL that has never been reset.
	TrimOffset int64
	// LastWriteTimestamp orders the two slots: the valid slot with the larger
	// value is current.
	LastWriteTimestamp uint64
	// SlidingWindowMaxLength bounds the bytes that can be in flight; version
	// 0 recovery uses it to decide where to stop.
	SlidingWindowMaxLength uint64
	// ShutdownType says whether the last writer closed gracefully.
	ShutdownType ShutdownType
	// NodeID is the broker that owns the WAL.
	NodeID uint32
	// NodeEpoch is the broker's epoch when it last opened the WAL.
	NodeEpoch uint64
	// CRC is the masked CRC32 of bytes 0-51 as stored (filled by decode and
	// by encode).
	CRC uint32
}

// Version returns 0 or 1 for a known magic and -1 otherwise.
func (h Header) Version() int {
	switch h.Magic {
	case MagicV0:
		return 0
	case MagicV1:
		return 1
	default:
		return -1
	}
}

// Batch is one stream record batch, the body of a data record.
type Batch struct {
	// StreamID identifies the stream.
	StreamID uint64
	// Epoch is the stream epoch the batch was written under.
	Epoch uint64
	// BaseOffset is the first stream offset in the batch.
	BaseOffset uint64
	// Count is the number of offsets in the batch (AutoMQ's
	// lastOffsetDelta): the batch covers [BaseOffset, BaseOffset+Count).
	Count uint32
	// Payload is the opaque batch content.
	Payload []byte
}

// EndOffset is one past the last stream offset of the batch.
func (b Batch) EndOffset() uint64 { return b.BaseOffset + uint64(b.Count) }

// bodySize is the encoded size of the batch body.
func (b Batch) bodySize() int { return BodyHeaderSize + len(b.Payload) }

// recordSize is the encoded size of the record (header and body).
func (b Batch) recordSize() int { return RecordHeaderSize + b.bodySize() }

var crcTable = crc32.MakeTable(crc32.IEEE)

// Checksum is the masked CRC32 (IEEE) every WAL checksum uses.
func Checksum(p []byte) uint32 { return crc32.Checksum(p, crcTable) & 0x7FFFFFFF }

// recordHeaderCRCLen is the number of record header bytes the header CRC
// covers.
const recordHeaderCRCLen = 20

// headerCRCTables holds, for a message of exactly 20 bytes, the
// contribution of each byte position to its CRC32 (IEEE). CRC32 of a fixed
// length is affine in the message bits, so crc(m) = crc(zeros) xor
// T[0][m0] xor ... xor T[19][m19]: twenty independent table loads instead of
// the dependent chain a general CRC needs for a short message. The record
// scan checks one record header CRC per record with it.
type headerCRCTables struct {
	zero uint32
	t    [recordHeaderCRCLen][256]uint32
}

var headerCRC = sync.OnceValue(func() *headerCRCTables {
	tab := &headerCRCTables{}
	var m [recordHeaderCRCLen]byte
	tab.zero = crc32.ChecksumIEEE(m[:])
	for i := range m {
		for v := 0; v < 256; v++ {
			m[i] = byte(v)
			tab.t[i][v] = crc32.ChecksumIEEE(m[:]) ^ tab.zero
		}
		m[i] = 0
	}
	return tab
})

// checksum20 is Checksum(p[:20]).
func (tab *headerCRCTables) checksum20(p []byte) uint32 {
	p = p[:recordHeaderCRCLen]
	t := &tab.t
	c := tab.zero ^
		t[0][p[0]] ^ t[1][p[1]] ^ t[2][p[2]] ^ t[3][p[3]] ^ t[4][p[4]] ^
		t[5][p[5]] ^ t[6][p[6]] ^ t[7][p[7]] ^ t[8][p[8]] ^ t[9][p[9]] ^
		t[10][p[10]] ^ t[11][p[11]] ^ t[12][p[12]] ^ t[13][p[13]] ^ t[14][p[14]] ^
		t[15][p[15]] ^ t[16][p[16]] ^ t[17][p[17]] ^ t[18][p[18]] ^ t[19][p[19]]
	return c & 0x7FFFFFFF
}

// encodeHeader writes h into p[:HeaderSize], computing and storing the CRC.
func encodeHeader(p []byte, h *Header) {
	be := binary.BigEndian
	be.PutUint32(p[0:], h.Magic)
	be.PutUint64(p[4:], h.Capacity)
	be.PutUint64(p[12:], uint64(h.TrimOffset))
	be.PutUint64(p[20:], h.LastWriteTimestamp)
	be.PutUint64(p[28:], h.SlidingWindowMaxLength)
	be.PutUint32(p[36:], uint32(h.ShutdownType))
	be.PutUint32(p[40:], h.NodeID)
	be.PutUint64(p[44:], h.NodeEpoch)
	h.CRC = Checksum(p[:52])
	be.PutUint32(p[52:], h.CRC)
}

// decodeHeader parses one slot. It fails with ErrBadMagic or ErrHeaderCRC.
func decodeHeader(p []byte) (Header, error) {
	be := binary.BigEndian
	h := Header{
		Magic:                  be.Uint32(p[0:]),
		Capacity:               be.Uint64(p[4:]),
		TrimOffset:             int64(be.Uint64(p[12:])),
		LastWriteTimestamp:     be.Uint64(p[20:]),
		SlidingWindowMaxLength: be.Uint64(p[28:]),
		ShutdownType:           ShutdownType(be.Uint32(p[36:])),
		NodeID:                 be.Uint32(p[40:]),
		NodeEpoch:              be.Uint64(p[44:]),
		CRC:                    be.Uint32(p[52:]),
	}
	if h.Version() < 0 {
		return h, ErrBadMagic
	}
	if Checksum(p[:52]) != h.CRC {
		return h, ErrHeaderCRC
	}
	return h, nil
}

// recordHeader is the 24-byte header in front of every record body.
type recordHeader struct {
	magic      uint32
	bodyLength int32
	bodyOffset int64
	bodyCRC    uint32
	headerCRC  uint32
}

// encodeRecordHeader writes a record header for a record starting at logical
// offset start into p[:RecordHeaderSize].
func encodeRecordHeader(p []byte, magic uint32, start int64, bodyLength int, bodyCRC uint32) {
	be := binary.BigEndian
	be.PutUint32(p[0:], magic)
	be.PutUint32(p[4:], uint32(bodyLength))
	be.PutUint64(p[8:], uint64(start+RecordHeaderSize))
	be.PutUint32(p[16:], bodyCRC)
	be.PutUint32(p[20:], Checksum(p[:20]))
}

func decodeRecordHeader(p []byte) recordHeader {
	be := binary.BigEndian
	return recordHeader{
		magic:      be.Uint32(p[0:]),
		bodyLength: int32(be.Uint32(p[4:])),
		bodyOffset: int64(be.Uint64(p[8:])),
		bodyCRC:    be.Uint32(p[16:]),
		headerCRC:  be.Uint32(p[20:]),
	}
}

// encodeBodyHeader writes the 33 bytes in front of the payload.
func encodeBodyHeader(p []byte, b *Batch) {
	be := binary.BigEndian
	p[0] = BodyMagic
	be.PutUint64(p[1:], b.StreamID)
	be.PutUint64(p[9:], b.Epoch)
	be.PutUint64(p[17:], b.BaseOffset)
	be.PutUint32(p[25:], b.Count)
	be.PutUint32(p[29:], uint32(len(b.Payload)))
}

// bodyChecksum is the masked CRC32 of the encoded body of b, computed
// without encoding the payload a second time.
func bodyChecksum(b *Batch) uint32 {
	var hdr [BodyHeaderSize]byte
	encodeBodyHeader(hdr[:], b)
	c := crc32.Update(0, crcTable, hdr[:])
	c = crc32.Update(c, crcTable, b.Payload)
	return c & 0x7FFFFFFF
}

// decodeBodyInto parses a record body into b and reports whether it is well
// formed. The payload aliases p.
func decodeBodyInto(p []byte, b *Batch) bool {
	if len(p) < BodyHeaderSize || p[0] != BodyMagic {
		return false
	}
	be := binary.BigEndian
	if uint64(be.Uint32(p[29:])) != uint64(len(p)-BodyHeaderSize) {
		return false
	}
	b.StreamID = be.Uint64(p[1:])
	b.Epoch = be.Uint64(p[9:])
	b.BaseOffset = be.Uint64(p[17:])
	b.Count = be.Uint32(p[25:])
	b.Payload = p[BodyHeaderSize:]
	// A batch whose offsets wrap past 2^64 is no batch a writer made.
	return !b.offsetsWrap()
}

// offsetsWrap reports whether [BaseOffset, BaseOffset+Count) runs past 2^64.
func (b *Batch) offsetsWrap() bool { return b.BaseOffset+uint64(b.Count) < b.BaseOffset }

// PhysicalOffset returns the byte position on the device of logical offset
// off in a WAL of the given capacity: 8192 + off mod (capacity - 8192).
func PhysicalOffset(off, capacity int64) int64 { return physical(off, capacity) }

// physical maps a logical offset to its position on the device.
func physical(logical int64, capacity int64) int64 {
	return HeaderRegionSize + logical%(capacity-HeaderRegionSize)
}

// alignUp rounds n up to a multiple of BlockSize.
func alignUp(n int64) int64 { return (n + BlockSize - 1) / BlockSize * BlockSize }

// nextBlock is the next block boundary strictly after n (AutoMQ's
// alignNextBlock: an aligned offset moves a full block).
func nextBlock(n int64) int64 { return n/BlockSize*BlockSize + BlockSize }

func isAligned(n int64) bool { return n%BlockSize == 0 }
