package renewframe

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/protobuf/proto"
)

// ALPN is the application protocol an agent asks for in its TLS handshake
// to renew over frames.
const ALPN = "walden-renewals/1"

// Preface opens a connection without TLS that renews over frames. Its
// length is that of Sniff's read; no HTTP/2 client preface starts with it.
const Preface = "WALDEN-RENEW/1\r\n"

// The largest frames, without the length: a request carries a broker id
// and two integers; an answer a grant (the voters and their addresses
// included) or a refusal with its message.
const (
	MaxRequest  = 1 << 10
	MaxResponse = 64 << 10
)

// headerLen is the length before each frame's message.
const headerLen = 4

// ErrTooLarge means a frame announced more bytes than its side's limit.
var ErrTooLarge = errors.New("renewal frame too large")

// ErrMalformed means a frame's bytes are not the message it must carry.
var ErrMalformed = errors.New("renewal frame is not a valid message")

// Reader reads frames from one connection. It is not safe for concurrent
// use.
type Reader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewReader reads frames of at most max bytes from r, through a small
// buffer (a frame that arrives with the next one in one read costs one
// system call).
func NewReader(r io.Reader, max int) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 512), max: max}
}

// Read reads the next frame into m. It returns io.EOF when the connection
// ended between two frames, io.ErrUnexpectedEOF when it ended inside one,
// and ErrTooLarge or ErrMalformed (wrapped, with the figures) when the
// frame cannot be taken; after any error the connection must be closed.
func (r *Reader) Read(m proto.Message) error {
	var h [headerLen]byte
	if _, err := io.ReadFull(r.r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if uint64(n) > uint64(r.max) {
		return fmt.Errorf("%w: %d bytes announced, at most %d taken", ErrTooLarge, n, r.max)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// Writer writes frames to one connection, each with a single write (one
// TLS record, one system call). It is not safe for concurrent use.
type Writer struct {
	w   io.Writer
	max int
	buf []byte
}

// NewWriter writes frames of at most max bytes to w.
func NewWriter(w io.Writer, max int) *Writer {
	return &Writer{w: w, max: max}
}

// Write writes m as one frame; a message above the limit is not written
// (ErrTooLarge).
func (w *Writer) Write(m proto.Message) error {
	b, err := proto.MarshalOptions{}.MarshalAppend(append(w.buf[:0], 0, 0, 0, 0), m)
	if err != nil {
		return err
	}
	w.buf = b
	n := len(b) - headerLen
	if n > w.max {
		return fmt.Errorf("%w: a message of %d bytes, at most %d sent", ErrTooLarge, n, w.max)
	}
	binary.BigEndian.PutUint32(b, uint32(n))
	_, err = w.w.Write(b)
	return err
}

// Sniff reads the first len(Preface) bytes of a connection without TLS
// and says whether they are Preface. The connection it returns reads the
// bytes after Preface when they are, and every byte read (those of Sniff
// first) when they are not, so that the other protocol's server gets the
// connection as it came.
func Sniff(c net.Conn) (net.Conn, bool, error) {
	b := make([]byte, len(Preface))
	n, err := io.ReadFull(c, b)
	if err != nil {
		if n == 0 {
			return nil, false, err
		}
		return &replayConn{Conn: c, head: b[:n]}, false, nil
	}
	if bytes.Equal(b, []byte(Preface)) {
		return c, true, nil
	}
	return &replayConn{Conn: c, head: b}, false, nil
}

// replayConn reads head before the rest of its connection.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
