package protocol_test

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"walden/automq/protocol"
)

// body returns the body of a vector's frame (after its header).
func body(t *testing.T, name string) (vector, []byte) {
	t.Helper()
	for _, v := range loadVectors(t) {
		if v.name != name {
			continue
		}
		frame := mustFrame(t, v)
		n := int(num(t, v.meta["header_length"]))
		return v, append([]byte(nil), frame[n:]...)
	}
	t.Fatalf("no vector %s", name)
	return vector{}, nil
}

// TestCutFramesAreTruncated cuts every AutoMQ frame at every byte: each
// cut is refused as truncated, and the message it was decoded into keeps
// what it held.
func TestCutFramesAreTruncated(t *testing.T) {
	for _, v := range loadVectors(t) {
		if v.key == protocol.KeyApiVersions {
			continue
		}
		frame := mustFrame(t, v)
		for n := 0; n < len(frame); n++ {
			var err error
			if v.request {
				_, _, err = protocol.ParseRequest(frame[:n])
			} else {
				_, _, err = protocol.ParseResponse(frame[:n], v.key, v.version)
			}
			if !errors.Is(err, protocol.ErrTruncated) {
				t.Fatalf("%s cut at %d of %d bytes: err %v, want ErrTruncated", v.name, n, len(frame), err)
			}
		}
		// A stream that ends inside the frame.
		if _, err := protocol.ReadFrame(bytes.NewReader(v.bin[:len(v.bin)-1]), protocol.DefaultMaxFrameSize); !errors.Is(err, protocol.ErrTruncated) {
			t.Fatalf("%s: ReadFrame of a cut stream: %v", v.name, err)
		}
	}
	_, b := body(t, "GET_OPENING_STREAMS_v0_response")
	m := &protocol.GetOpeningStreamsResponse{ErrorCode: 77, ThrottleMillis: 5}
	before := *m
	if err := m.ReadFrom(b[:len(b)-9]); err == nil || !reflect.DeepEqual(*m, before) {
		t.Fatalf("a failed decode changed the message (err %v): %+v", err, *m)
	}
}

// TestGarbledFramesAreRefused changes bytes of real frames into what no
// AutoMQ writer produces; each is refused with the field and offset named.
func TestGarbledFramesAreRefused(t *testing.T) {
	type garble struct {
		vector  string
		edit    func([]byte) []byte
		err     error
		mention string
	}
	set := func(i int, b ...byte) func([]byte) []byte {
		return func(p []byte) []byte { copy(p[i:], b); return p }
	}
	// AUTOMQ_GET_NODES_v0_response body: errorCode(2) throttle(4) nodes-len(1) then node 0:
	// nodeId(4) nodeEpoch(8) walConfig len at 19.
	cases := map[string]garble{
		"trailing byte": {"CLOSE_STREAMS_v0_request", func(p []byte) []byte { return append(p, 0) },
			protocol.ErrMalformed, "1 bytes left after the message"},
		"null string": {"AUTOMQ_GET_NODES_v0_response", set(19, 0),
			protocol.ErrMalformed, "nodes[0].walConfig at byte 19: null string"},
		"string not UTF-8": {"AUTOMQ_GET_NODES_v0_response", set(20, 0xff, 0xfe),
			protocol.ErrMalformed, "nodes[0].walConfig at byte 20: string is not UTF-8"},
		"bool 2": {"GET_OPENING_STREAMS_v0_request", set(12, 2),
			protocol.ErrMalformed, "failoverMode at byte 12: a bool is 0 or 1, not 2"},
		"null array": {"CLOSE_STREAMS_v0_request", set(12, 0),
			protocol.ErrMalformed, "closeStreamRequests at byte 12: null array"},
		"array longer than the frame": {"CLOSE_STREAMS_v0_request", set(12, 0xff, 0xff, 0xff, 0xff, 0x07),
			protocol.ErrTruncated, "array of 2147483646 elements"},
		"varint over 32 bits": {"CLOSE_STREAMS_v0_request", set(12, 0xff, 0xff, 0xff, 0xff, 0x1f),
			protocol.ErrMalformed, "varint longer than 32 bits"},
		"overlong varint": {"GET_OPENING_STREAMS_v0_request", func(p []byte) []byte { return append(p[:13], 0x80, 0x00) },
			protocol.ErrMalformed, "tagged fields at byte 13: overlong varint"},
		"tags out of order": {"GET_OPENING_STREAMS_v0_request", func(p []byte) []byte {
			return append(p[:13], 2, 5, 1, 0xaa, 3, 1, 0xbb)
		}, protocol.ErrMalformed, "tag 3 after tag 5"},
		"tag longer than the frame": {"GET_OPENING_STREAMS_v0_request", func(p []byte) []byte {
			return append(p[:13], 1, 0, 9, 1)
		}, protocol.ErrTruncated, "tag 0 at byte 16: needs 9 bytes"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			v, b := body(t, c.vector)
			b = c.edit(b)
			var m kmsg.Response
			var req kmsg.Request
			var err error
			if v.request {
				req = protocol.NewRequest(v.key)
				req.SetVersion(v.version)
				err = req.ReadFrom(b)
			} else {
				m = protocol.NewResponse(v.key)
				m.SetVersion(v.version)
				err = m.ReadFrom(b)
			}
			if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("err %v, want %v mentioning %q", err, c.err, c.mention)
			}
			var de *protocol.DecodeError
			if !errors.As(err, &de) || de.Message == "" {
				t.Fatalf("%v is not a DecodeError naming the message", err)
			}
		})
	}
}

func TestUnknownTaggedFieldsAreKept(t *testing.T) {
	// A later AutoMQ adds tag 0 (EndOffset) to each stream: an unknown
	// tag here, kept and written back.
	m := &protocol.CloseStreamsRequest{NodeID: 3, NodeEpoch: 9, CloseStreamRequests: []protocol.CloseStreamRequest{{StreamID: 10, StreamEpoch: 2}}}
	m.CloseStreamRequests[0].UnknownTags.Set(0, []byte{0x80, 0x01})
	m.UnknownTags.Set(7, []byte("x"))
	enc, err := protocol.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	var back protocol.CloseStreamsRequest
	if err := back.ReadFrom(enc); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, m) || !bytes.Equal(back.AppendTo(nil), enc) {
		t.Fatalf("tags not kept: %+v", back)
	}
}

// TestFieldsAbsentFromTheVersionAreRefused: a value in a field that the
// version does not have is refused at encoding, never silently dropped.
func TestFieldsAbsentFromTheVersionAreRefused(t *testing.T) {
	cases := []struct {
		m     protocol.Message
		field string
	}{
		{&protocol.CommitStreamSetObjectRequest{Attributes: 12}, "attributes"},
		{&protocol.CommitStreamSetObjectRequest{StreamObjects: []protocol.StreamObject{{}, {Attributes: 4}}}, "streamObjects[1].attributes"},
		{&protocol.CommitStreamSetObjectResponse{Attributes: 12}, "attributes"},
		{&protocol.OpenStreamsRequest{OpenStreamRequests: []protocol.OpenStreamRequest{{Tags: []protocol.Tag{{Key: "topic", Value: "t"}}}}}, "openStreamRequests[0].tags"},
	}
	for _, c := range cases {
		_, err := protocol.Encode(c.m)
		var ee *protocol.EncodeError
		if !errors.Is(err, protocol.ErrFieldNotInVersion) || !errors.As(err, &ee) || ee.Field != c.field {
			t.Fatalf("%T: err %v, want ErrFieldNotInVersion on %s", c.m, err, c.field)
		}
		if got := c.m.AppendTo([]byte{1, 2}); !bytes.Equal(got, []byte{1, 2}) {
			t.Fatalf("%T: AppendTo of a refused message appended %x", c.m, got[2:])
		}
		if req, ok := c.m.(kmsg.Request); ok {
			if out, err := protocol.AppendRequest(nil, 1, nil, req); !errors.Is(err, protocol.ErrFieldNotInVersion) || len(out) != 0 {
				t.Fatalf("%T: AppendRequest: %v, %d bytes", c.m, err, len(out))
			}
		} else if out, err := protocol.AppendResponse(nil, 1, c.m.(kmsg.Response)); !errors.Is(err, protocol.ErrFieldNotInVersion) || len(out) != 0 {
			t.Fatalf("%T: AppendResponse: %v, %d bytes", c.m, err, len(out))
		}
		// The same values encode at v1.
		c.m.SetVersion(1)
		if _, err := protocol.Encode(c.m); err != nil {
			t.Fatalf("%T at v1: %v", c.m, err)
		}
	}
}

func TestValuesTheWireCannotCarry(t *testing.T) {
	for _, m := range []protocol.Message{
		&protocol.AutomqGetNodesResponse{Nodes: []protocol.NodeMetadata{{WALConfig: "\xff"}}},
		&protocol.AutomqGetNodesResponse{Nodes: []protocol.NodeMetadata{{Tags: []protocol.Tag{{Key: strings.Repeat("k", 0x8000)}}}}},
		&protocol.OpenStreamsRequest{Version: 1, OpenStreamRequests: []protocol.OpenStreamRequest{{Tags: []protocol.Tag{{Value: "\xc0"}}}}},
	} {
		if _, err := protocol.Encode(m); !errors.Is(err, protocol.ErrInvalidField) {
			t.Fatalf("%T: %v, want ErrInvalidField", m, err)
		}
	}
	for _, m := range []protocol.Message{&protocol.OpenStreamsRequest{Version: 2}, &protocol.CloseStreamsResponse{Version: 1}, &protocol.PrepareS3ObjectRequest{Version: -1}} {
		if _, err := protocol.Encode(m); !errors.Is(err, protocol.ErrVersion) {
			t.Fatalf("%T v%d: %v, want ErrVersion", m, m.GetVersion(), err)
		}
		if err := m.ReadFrom(nil); !errors.Is(err, protocol.ErrVersion) {
			t.Fatalf("%T v%d decode: %v, want ErrVersion", m, m.GetVersion(), err)
		}
	}
}

func TestFrameHeaders(t *testing.T) {
	// Unknown key, unsupported version, negative client id length.
	frame := []byte{0x7f, 0x00, 0, 0, 0, 0, 0, 1}
	if h, req, err := protocol.ParseRequest(frame); !errors.Is(err, protocol.ErrUnknownAPI) || req != nil || h.CorrelationID != 1 {
		t.Fatalf("unknown key: %+v %v %v", h, req, err)
	}
	frame = []byte{0x01, 0xf6, 0, 2, 0, 0, 0, 5} // OpenStreams v2
	if h, _, err := protocol.ParseRequest(frame); !errors.Is(err, protocol.ErrVersion) || h.CorrelationID != 5 {
		t.Fatalf("OpenStreams v2: %+v %v", h, err)
	}
	frame = []byte{0x01, 0xf6, 0, 0, 0, 0, 0, 5, 0xff, 0xfe}
	if _, _, err := protocol.ParseRequest(frame); !errors.Is(err, protocol.ErrMalformed) {
		t.Fatalf("client id length -2: %v", err)
	}
	// A null client id round-trips.
	req := &protocol.GetOpeningStreamsRequest{NodeID: 1, NodeEpoch: 2}
	out, err := protocol.AppendRequest(nil, 9, nil, req)
	if err != nil {
		t.Fatal(err)
	}
	h, got, err := protocol.ParseRequest(out[4:])
	if err != nil || h.ClientID != nil || !reflect.DeepEqual(got, req) {
		t.Fatalf("null client id: %+v %+v %v", h, got, err)
	}
	// Response of an unknown API or version.
	if _, _, err := protocol.ParseResponse([]byte{0, 0, 0, 1, 0}, 0x7f00, 0); !errors.Is(err, protocol.ErrUnknownAPI) {
		t.Fatalf("unknown response key: %v", err)
	}
	if _, _, err := protocol.ParseResponse([]byte{0, 0, 0, 1, 0}, protocol.KeyCommitStreamSetObject, 2); !errors.Is(err, protocol.ErrVersion) {
		t.Fatalf("CommitStreamSetObject v2 response: %v", err)
	}
	// Frame sizes.
	for _, prefix := range [][]byte{{0xff, 0xff, 0xff, 0xff}, {0x7f, 0, 0, 0}} {
		if _, err := protocol.ReadFrame(bytes.NewReader(prefix), 1<<20); !errors.Is(err, protocol.ErrFrameSize) {
			t.Fatalf("size %x: %v", prefix, err)
		}
	}
	if _, err := protocol.ReadFrame(bytes.NewReader(nil), 1<<20); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
	if _, err := protocol.ReadFrame(bytes.NewReader([]byte{0, 0}), 1<<20); !errors.Is(err, protocol.ErrTruncated) {
		t.Fatalf("half a size prefix: %v", err)
	}
}

func TestAPITable(t *testing.T) {
	for _, a := range protocol.APIs {
		req, resp := protocol.NewRequest(a.Key), protocol.NewResponse(a.Key)
		if req.Key() != a.Key || resp.Key() != a.Key || req.MaxVersion() != a.MaxVersion || resp.MaxVersion() != a.MaxVersion {
			t.Fatalf("%s: key or versions differ from the table", a.Name)
		}
		if protocol.NameForKey(a.Key) != a.Name || !req.IsFlexible() {
			t.Fatalf("%s: name or flexibility", a.Name)
		}
		req.SetVersion(a.MaxVersion)
		if k := req.ResponseKind(); k.Key() != a.Key || k.GetVersion() != a.MaxVersion {
			t.Fatalf("%s: ResponseKind %T v%d", a.Name, k, k.GetVersion())
		}
		resp.SetVersion(a.MaxVersion)
		if k := resp.RequestKind(); k.Key() != a.Key || k.GetVersion() != a.MaxVersion {
			t.Fatalf("%s: RequestKind %T v%d", a.Name, k, k.GetVersion())
		}
		if _, ok := resp.(kmsg.ThrottleResponse); !ok {
			t.Fatalf("%s: the response does not tell kgo its throttle", a.Name)
		}
	}
	if protocol.NewRequest(18) == nil || protocol.NameForKey(18) != "ApiVersions" || protocol.NewRequest(0x7f00) != nil {
		t.Fatal("kmsg's keys are not looked up")
	}
}
