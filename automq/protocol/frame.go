package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultMaxFrameSize is the largest frame ReadFrame accepts unless told
// otherwise: 100 MiB, Kafka's default socket.request.max.bytes.
const DefaultMaxFrameSize = 100 << 20

// RequestHeader is a request frame's header: v2 (with a tagged-field
// section) for a flexible request, v1 otherwise. The client id is a
// classic nullable string (int16 length, -1 for null) in both.
type RequestHeader struct {
	APIKey        int16
	APIVersion    int16
	CorrelationID int32
	// ClientID is nil for a null client id.
	ClientID *string
	// UnknownTags are the header's tagged fields (v2).
	UnknownTags kmsg.Tags
}

// ResponseHeader is a response frame's header: v1 (with a tagged-field
// section) for a flexible response, v0 (the correlation id alone)
// otherwise and always for ApiVersions.
type ResponseHeader struct {
	CorrelationID int32
	UnknownTags   kmsg.Tags
}

// responseHeaderFlexible says whether a response of this key and
// flexibility has header v1: ApiVersions responses keep header v0 at every
// version, so that a client that does not yet know the server's versions
// can read them.
func responseHeaderFlexible(key int16, flexible bool) bool {
	return flexible && key != KeyApiVersions
}

// AppendRequest appends a whole request frame to dst: the int32 size, the
// header (v2 for a flexible request, v1 otherwise) and the body. A message
// of this package that fails Validate is refused and nothing is appended.
func AppendRequest(dst []byte, correlationID int32, clientID *string, req kmsg.Request) ([]byte, error) {
	if m, ok := req.(Message); ok {
		if err := m.Validate(); err != nil {
			return dst, err
		}
	}
	if clientID != nil && len(*clientID) > maxStringLen {
		return dst, &EncodeError{Message: "request header", Field: "clientId", Reason: fmt.Sprintf("%d bytes, longer than the %d Kafka allows", len(*clientID), maxStringLen), Err: ErrInvalidField}
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = appendInt16(dst, req.Key())
	dst = appendInt16(dst, req.GetVersion())
	dst = appendInt32(dst, correlationID)
	if clientID == nil {
		dst = appendInt16(dst, -1)
	} else {
		dst = appendInt16(dst, int16(len(*clientID)))
		dst = append(dst, *clientID...)
	}
	if req.IsFlexible() {
		dst = append(dst, 0)
	}
	dst = req.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst, nil
}

// ParseRequest decodes a request frame (without its size prefix): the
// header, then the body into a new request of the header's key and version
// (this package's type for the six AutoMQ keys, kmsg's for Kafka's). On a
// body that does not decode, it returns the header with the error, so that
// a server can still answer the correlation id; on an unknown key or
// version the request is nil and the error wraps ErrUnknownAPI or
// ErrVersion.
func ParseRequest(frame []byte) (RequestHeader, kmsg.Request, error) {
	var h RequestHeader
	r := &reader{msg: "request header", src: frame}
	h.APIKey = r.int16("requestApiKey")
	h.APIVersion = r.int16("requestApiVersion")
	h.CorrelationID = r.int32("correlationId")
	if r.err != nil {
		return h, nil, r.err
	}
	name := NameForKey(h.APIKey)
	req := NewRequest(h.APIKey)
	if req == nil {
		return h, nil, &DecodeError{Message: "request header", Field: "requestApiKey", Reason: "API key " + strconv.Itoa(int(h.APIKey)) + " is not one this package or kmsg knows", Err: ErrUnknownAPI}
	}
	if h.APIVersion < 0 || h.APIVersion > req.MaxVersion() {
		return h, nil, &DecodeError{Message: name + "Request", Field: "requestApiVersion", Offset: 2,
			Reason: fmt.Sprintf("version %d, this package speaks 0 to %d", h.APIVersion, req.MaxVersion()), Err: ErrVersion}
	}
	req.SetVersion(h.APIVersion)
	clientAt := r.off
	switch n := r.int16("clientId"); {
	case r.err != nil:
	case n == -1:
	case n < 0:
		r.fail("clientId", clientAt, ErrMalformed, "string length %d", n)
	case r.need("clientId", int(n)):
		s := string(r.src[r.off : r.off+int(n)])
		r.off += int(n)
		h.ClientID = &s
	}
	if req.IsFlexible() {
		r.tags(&h.UnknownTags)
	}
	if r.err != nil {
		return h, nil, r.err
	}
	if err := readBody(req, name+"Request", frame[r.off:]); err != nil {
		return h, nil, err
	}
	return h, req, nil
}

// AppendResponse appends a whole response frame to dst: the int32 size,
// the header (v1 for a flexible response, v0 otherwise and for
// ApiVersions) and the body. A message of this package that fails Validate
// is refused and nothing is appended.
func AppendResponse(dst []byte, correlationID int32, resp kmsg.Response) ([]byte, error) {
	if m, ok := resp.(Message); ok {
		if err := m.Validate(); err != nil {
			return dst, err
		}
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = appendInt32(dst, correlationID)
	if responseHeaderFlexible(resp.Key(), resp.IsFlexible()) {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst, nil
}

// ParseResponse decodes a response frame (without its size prefix) to a
// request of the given key and version: the header, then the body into a
// new response. The caller compares the correlation id with the one it
// sent.
func ParseResponse(frame []byte, key, version int16) (ResponseHeader, kmsg.Response, error) {
	var h ResponseHeader
	name := NameForKey(key) + "Response"
	resp := NewResponse(key)
	if resp == nil {
		return h, nil, &DecodeError{Message: name, Reason: "API key " + strconv.Itoa(int(key)) + " is not one this package or kmsg knows", Err: ErrUnknownAPI}
	}
	if version < 0 || version > resp.MaxVersion() {
		return h, nil, &DecodeError{Message: name, Reason: fmt.Sprintf("version %d, this package speaks 0 to %d", version, resp.MaxVersion()), Err: ErrVersion}
	}
	resp.SetVersion(version)
	r := &reader{msg: "response header", src: frame}
	h.CorrelationID = r.int32("correlationId")
	if responseHeaderFlexible(key, resp.IsFlexible()) {
		r.tags(&h.UnknownTags)
	}
	if r.err != nil {
		return h, nil, r.err
	}
	if err := readBody(resp, name, frame[r.off:]); err != nil {
		return h, nil, err
	}
	return h, resp, nil
}

// readBody decodes a body into m, wrapping kmsg's errors (which are plain)
// as a DecodeError.
func readBody(m interface{ ReadFrom([]byte) error }, name string, body []byte) error {
	err := m.ReadFrom(body)
	if err == nil {
		return nil
	}
	var de *DecodeError
	if errors.As(err, &de) {
		return err
	}
	return &DecodeError{Message: name, Reason: err.Error(), Err: ErrMalformed}
}

// ReadFrame reads one size-prefixed frame from r and returns it without
// the prefix. A size below 0 or above max is refused (ErrFrameSize); a
// stream that ends inside a frame is ErrTruncated; a stream that ends
// before a frame starts is io.EOF.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	var size [4]byte
	if n, err := io.ReadFull(r, size[:]); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		if err == io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("automq protocol: the stream ends %d bytes into a size prefix: %w", n, ErrTruncated)
		}
		return nil, fmt.Errorf("automq protocol: read frame size: %w", err)
	}
	n := int64(int32(binary.BigEndian.Uint32(size[:])))
	if n < 0 || n > int64(max) {
		return nil, fmt.Errorf("automq protocol: frame of %d bytes, the limit is %d: %w", n, max, ErrFrameSize)
	}
	// The buffer grows with the bytes that arrive, so that a size prefix
	// alone does not make it allocate up to max.
	var frame bytes.Buffer
	got, err := io.CopyN(&frame, r, n)
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("automq protocol: the stream ends %d bytes into a frame of %d: %w", got, n, ErrTruncated)
		}
		return nil, fmt.Errorf("automq protocol: read frame: %w", err)
	}
	return frame.Bytes(), nil
}
