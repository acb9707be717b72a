package gossip

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// Listener is the pair of sockets one gossip member uses, bound to one
// address: TCP for memberlist's streams (joins, push/pull, the fallback
// probe) and UDP for its packets (probes, gossip). Listen binds both.
//
// A test binds "127.0.0.1:0", learns the address from Addr and hands the
// Listener to Start in Config.Listener instead of an address, so that no
// port is picked free and then taken by someone else before memberlist
// binds it. Start takes it over: the pool closes it when it shuts down, or
// when Start fails.
type Listener struct {
	stream *net.TCPListener
	packet *net.UDPConn
	closed atomic.Bool
}

// listenAttempts bounds the picks of a port for Listen's port 0: the TCP
// port the kernel picks may be taken for UDP.
const listenAttempts = 10

// Listen binds TCP and UDP on addr ("ip:port", the IP a literal). With
// port 0 the kernel picks the TCP port and UDP is bound on the same one;
// when that one is taken for UDP, another is picked.
func Listen(addr string) (*Listener, error) {
	ap, err := parseIPPort("listen", addr, true)
	if err != nil {
		return nil, err
	}
	var last error
	for range listenAttempts {
		stream, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap))
		if err != nil {
			return nil, fmt.Errorf("gossip: listen on %s (tcp): %w", addr, err)
		}
		port := stream.Addr().(*net.TCPAddr).AddrPort().Port()
		packet, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ap.Addr(), port)))
		if err == nil {
			return &Listener{stream: stream, packet: packet}, nil
		}
		_ = stream.Close()
		last = err
		if ap.Port() != 0 || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("gossip: listen on %s (udp): %w", addr, last)
}

// Addr is the "ip:port" both sockets are bound to.
func (l *Listener) Addr() string { return l.stream.Addr().String() }

// Close closes both sockets; closing again does nothing.
func (l *Listener) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	return errors.Join(l.stream.Close(), l.packet.Close())
}

// Receive sizes of the UDP socket: a packet of memberlist is at most a
// UDP datagram; the socket's buffer is raised so that a burst of gossip is
// not dropped by the kernel while the reader is busy (halved until the
// system allows it).
const (
	maxPacketSize    = 65536
	packetReadBuffer = 2 << 20
)

// listenerTransport is a memberlist transport on a Listener the caller
// bound: it accepts streams and reads packets from its sockets and hands
// them to memberlist, and sends from them. Its shutdown closes the
// Listener.
type listenerTransport struct {
	l       *Listener
	logger  *log.Logger
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	stop    sync.Once
	wg      sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*listenerTransport)(nil)

func newListenerTransport(l *Listener, logger *log.Logger) *listenerTransport {
	for size := packetReadBuffer; size > 0; size /= 2 {
		if l.packet.SetReadBuffer(size) == nil {
			break
		}
	}
	t := &listenerTransport{
		l: l, logger: logger,
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
	}
	t.wg.Add(2)
	go t.acceptStreams()
	go t.readPackets()
	return t
}

// FinalAdvertiseAddr is the address other members reach this one at: the
// advertise address when one is set, else the Listener's own (refused when
// it is bound to every address of the host: say which one others use).
func (t *listenerTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		addr := net.ParseIP(ip)
		if addr == nil {
			return nil, 0, fmt.Errorf("gossip: advertise address %q is not an IP address", ip)
		}
		if v4 := addr.To4(); v4 != nil {
			addr = v4
		}
		return addr, port, nil
	}
	bound := t.l.stream.Addr().(*net.TCPAddr)
	if bound.IP.IsUnspecified() {
		return nil, 0, fmt.Errorf("gossip: the listener is bound to %s, every address of the host: set advertise to the one other members reach", bound)
	}
	addr := bound.IP
	if v4 := addr.To4(); v4 != nil {
		addr = v4
	}
	return addr, bound.Port, nil
}

// WriteTo sends one packet to addr.
func (t *listenerTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends one packet to a.Addr; the time is taken once the
// write returns.
func (t *listenerTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	to, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.l.packet.WriteTo(b, to)
	return time.Now(), err
}

// PacketCh delivers the packets received.
func (t *listenerTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout opens a stream to addr.
func (t *listenerTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout opens a stream to a.Addr within timeout.
func (t *listenerTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", a.Addr)
}

// StreamCh delivers the streams accepted.
func (t *listenerTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the Listener and waits for the loops that read it.
func (t *listenerTransport) Shutdown() error {
	var err error
	t.stop.Do(func() {
		close(t.done)
		err = t.l.Close()
		t.wg.Wait()
	})
	return err
}

func (t *listenerTransport) stopping() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// acceptStreams hands every accepted connection to memberlist. An accept
// error other than the shutdown's is logged and retried after a pause that
// doubles up to a second (a host out of file descriptors).
func (t *listenerTransport) acceptStreams() {
	defer t.wg.Done()
	var pause time.Duration
	for {
		conn, err := t.l.stream.AcceptTCP()
		if err != nil {
			if t.stopping() || errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			t.logger.Printf("[ERR] gossip: accept a stream: %v", err)
			select {
			case <-time.After(pause):
			case <-t.done:
				return
			}
			continue
		}
		pause = 0
		select {
		case t.streams <- conn:
		case <-t.done:
			_ = conn.Close()
			return
		}
	}
}

// readPackets hands every packet received to memberlist, stamped as close
// to the read as possible. Each is read into one buffer of the largest
// packet's size, kept for every read, and handed over as a copy of exactly
// its length: memberlist keeps what it is handed (its handoff queues hold
// gossip messages, slices of their packet, until its handler takes them),
// and memberlist's own transport reads each packet into a fresh 64 KiB
// buffer, which is garbage at thousands of packets a second and, held in a
// queue, 64 KiB for a message of a hundred bytes.
func (t *listenerTransport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacketSize)
	for {
		n, from, err := t.l.packet.ReadFrom(buf)
		at := time.Now()
		if err != nil {
			if t.stopping() || errors.Is(err, net.ErrClosed) {
				return
			}
			t.logger.Printf("[ERR] gossip: read a packet: %v", err)
			continue
		}
		if n == 0 {
			continue
		}
		own := make([]byte, n)
		copy(own, buf)
		select {
		case t.packets <- &memberlist.Packet{Buf: own, From: from, Timestamp: at}:
		case <-t.done:
			return
		}
	}
}
