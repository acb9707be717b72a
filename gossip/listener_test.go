package gossip

import (
	"bytes"
	"io"
	"log"
	"net"
	"testing"
	"time"
)

// TestListenerHandsPacketsOfTheirOwnSize: a Listener's transport hands
// memberlist every packet in a buffer of exactly its size, its own: a
// packet held (as memberlist's handoff queues hold gossip messages) keeps
// its bytes when the next one arrives, and keeps no receive buffer of the
// largest packet's size alive with it.
func TestListenerHandsPacketsOfTheirOwnSize(t *testing.T) {
	tr := newListenerTransport(listen(t), log.New(io.Discard, "", 0))
	defer tr.Shutdown()
	to, err := net.ResolveUDPAddr("udp", tr.l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp", nil, to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	sent := [][]byte{bytes.Repeat([]byte{'a'}, 100), bytes.Repeat([]byte{'b'}, 40), bytes.Repeat([]byte{'c'}, 1400)}
	for _, b := range sent {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var held [][]byte
	for i := range sent {
		select {
		case p := <-tr.PacketCh():
			if cap(p.Buf) != len(p.Buf) {
				t.Errorf("packet %d: %d bytes in a buffer of %d", i, len(p.Buf), cap(p.Buf))
			}
			if p.From.String() != c.LocalAddr().String() {
				t.Errorf("packet %d from %s, want %s", i, p.From, c.LocalAddr())
			}
			held = append(held, p.Buf)
		case <-time.After(10 * time.Second):
			t.Fatalf("packet %d of %d not handed over within 10 s", i, len(sent))
		}
	}
	// Loopback UDP keeps the order; every packet held keeps its own bytes.
	for i, b := range sent {
		if !bytes.Equal(held[i], b) {
			t.Errorf("packet %d holds %d bytes %.10q…, want %d bytes %.10q…", i, len(held[i]), held[i], len(b), b)
		}
	}
}
