package protocol_test

import (
	"bytes"
	"testing"

	"walden/automq/protocol"
)

// FuzzDecodeFrames feeds any bytes to every decoder of the package: a
// frame's header and body as request and as response of every AutoMQ API
// and version, each body decoder alone, and ReadFrame. Nothing panics, and
// whatever decodes encodes back to the same bytes.
func FuzzDecodeFrames(f *testing.F) {
	for _, v := range loadVectors(f) {
		frame := mustFrame(f, v)
		f.Add(frame)
		f.Add(frame[int(num(f, v.meta["header_length"])):])
		f.Add(v.bin)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, req, err := protocol.ParseRequest(data); err == nil {
			if _, ok := protocol.LookupAPI(h.APIKey); ok && h.UnknownTags.Len() == 0 {
				out, err := protocol.AppendRequest(nil, h.CorrelationID, h.ClientID, req)
				if err != nil || !bytes.Equal(out[4:], data) {
					t.Fatalf("request %+v decoded from %x encodes to %x (%v)", h, data, out, err)
				}
			}
		}
		for _, a := range protocol.APIs {
			for v := a.MinVersion; v <= a.MaxVersion; v++ {
				if h, resp, err := protocol.ParseResponse(data, a.Key, v); err == nil && h.UnknownTags.Len() == 0 {
					out, err := protocol.AppendResponse(nil, h.CorrelationID, resp)
					if err != nil || !bytes.Equal(out[4:], data) {
						t.Fatalf("%s v%d response decoded from %x encodes to %x (%v)", a.Name, v, data, out, err)
					}
				}
				for _, m := range []protocol.Message{protocol.NewRequest(a.Key).(protocol.Message), protocol.NewResponse(a.Key).(protocol.Message)} {
					m.SetVersion(v)
					if err := m.ReadFrom(data); err == nil {
						if out, err := protocol.Encode(m); err != nil || !bytes.Equal(out, data) {
							t.Fatalf("%T v%d decoded from %x encodes to %x (%v)", m, v, data, out, err)
						}
					}
				}
			}
		}
		_, _ = protocol.ReadFrame(bytes.NewReader(data), 1<<16)
	})
}
