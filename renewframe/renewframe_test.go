package renewframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

func TestRoundTrip(t *testing.T) {
	var wire bytes.Buffer
	w := NewWriter(&wire, MaxRequest)
	sent := []*waldenv1.RenewLeasesRequest{
		{BrokerId: "b1", Epoch: 3, Seq: 1},
		{BrokerId: "b1", Epoch: 3, Seq: 2},
		{}, // an empty message is a zero-length frame
		{BrokerId: strings.Repeat("x", 200), Epoch: 1 << 62, Seq: 1 << 40},
	}
	writes := 0
	for _, m := range sent {
		before := wire.Len()
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
		writes++
		if got, want := wire.Len()-before, headerLen+proto.Size(m); got != want {
			t.Fatalf("frame of %v: %d bytes, want %d", m, got, want)
		}
	}
	r := NewReader(&wire, MaxRequest)
	for i, want := range sent {
		got := &waldenv1.RenewLeasesRequest{}
		if err := r.Read(got); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("frame %d: got %v, want %v", i, got, want)
		}
	}
	if err := r.Read(&waldenv1.RenewLeasesRequest{}); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// oneWrite counts the writes a frame takes.
type oneWrite struct{ n int }

func (w *oneWrite) Write(p []byte) (int, error) { w.n++; return len(p), nil }

func TestAFrameIsOneWrite(t *testing.T) {
	var c oneWrite
	w := NewWriter(&c, MaxResponse)
	for i := 0; i < 3; i++ {
		if err := w.Write(&waldenv1.RenewLeasesResponse{Seq: uint64(i), Grant: &waldenv1.RenewLeaseResponse{}}); err != nil {
			t.Fatal(err)
		}
	}
	if c.n != 3 {
		t.Fatalf("3 frames took %d writes", c.n)
	}
}

func frame(n uint32, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, n)
	return append(b, body...)
}

func TestBadFrames(t *testing.T) {
	good, _ := proto.Marshal(&waldenv1.RenewLeasesRequest{BrokerId: "b1", Epoch: 1, Seq: 1})
	cases := []struct {
		name string
		wire []byte
		want error
	}{
		{"too large", frame(MaxRequest+1, nil), ErrTooLarge},
		{"largest length there is", frame(^uint32(0), nil), ErrTooLarge},
		{"cut in its length", []byte{0, 0}, io.ErrUnexpectedEOF},
		{"cut in its message", frame(uint32(len(good)), good[:len(good)-1]), io.ErrUnexpectedEOF},
		{"not the message", frame(3, []byte{0xff, 0xff, 0xff}), ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := &waldenv1.RenewLeasesRequest{}
			err := NewReader(bytes.NewReader(c.wire), MaxRequest).Read(got)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if !proto.Equal(got, &waldenv1.RenewLeasesRequest{}) {
				t.Fatalf("a bad frame filled in %v", got)
			}
		})
	}
}

func TestWriterRefusesAMessageAboveTheLimit(t *testing.T) {
	var wire bytes.Buffer
	err := NewWriter(&wire, MaxRequest).Write(&waldenv1.RenewLeasesRequest{BrokerId: strings.Repeat("x", MaxRequest)})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if wire.Len() != 0 {
		t.Fatalf("%d bytes written", wire.Len())
	}
}

func TestSniff(t *testing.T) {
	h2 := "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	cases := []struct {
		name   string
		sent   string
		frames bool
		rest   string
	}{
		{"frames", Preface + "after", true, "after"},
		{"an HTTP/2 client", h2, false, h2},
		{"a short greeting, then the end", "PRI", false, "PRI"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server, client := net.Pipe()
			go func() {
				client.Write([]byte(c.sent))
				client.Close()
			}()
			server.SetDeadline(time.Now().Add(10 * time.Second))
			conn, frames, err := Sniff(server)
			if err != nil {
				t.Fatal(err)
			}
			if frames != c.frames {
				t.Fatalf("frames %v, want %v", frames, c.frames)
			}
			rest, err := io.ReadAll(conn)
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if string(rest) != c.rest {
				t.Fatalf("read %q after Sniff, want %q", rest, c.rest)
			}
		})
	}
	t.Run("nothing, then the end", func(t *testing.T) {
		server, client := net.Pipe()
		client.Close()
		if _, _, err := Sniff(server); err == nil {
			t.Fatal("Sniff of a connection that sent nothing: no error")
		}
	})
}

func FuzzRead(f *testing.F) {
	good, _ := proto.Marshal(&waldenv1.RenewLeasesRequest{BrokerId: "b1", Epoch: 1, Seq: 1})
	f.Add(frame(uint32(len(good)), good))
	f.Add(frame(MaxRequest+1, nil))
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := NewReader(bytes.NewReader(wire), MaxRequest)
		for i := 0; ; i++ {
			m := &waldenv1.RenewLeasesRequest{}
			if err := r.Read(m); err != nil {
				return
			}
			if i > len(wire)/headerLen {
				t.Fatalf("%d frames from %d bytes", i+1, len(wire))
			}
		}
	})
}
