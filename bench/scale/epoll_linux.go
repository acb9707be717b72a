//go:build linux

package main

import (
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/renewframe"
	"walden/rpcerr"
)

// renewLoop renews the leases of every agent of a load process (transport
// frames-epoll): the same connections of frames as package agent's Renewer
// and directRenewer — renewframe.Preface, one RenewLeasesRequest frame a
// renewal, one RenewLeasesResponse an answer matched by seq, the voters an
// answer leaves out taken from the connection's last — on the same
// schedule (every lease_ttl/3 or the renewal slot the coordinator asked
// for, attempts bounded by lease_ttl/6, agent.RenewalBackoff and
// agent.QuietRetry after a failure), so that the coordinators see the same
// traffic. What differs is the load side's cost: one goroutine drives every
// connection of the process through an epoll set of its own, with
// non-blocking sockets and one timer heap, where frames-direct parks a
// goroutine per connection in Go's scheduler and a timer per renewal; and
// the boot clock is read once per turn of the loop, the time since taken
// from Go's monotonic clock (read without a system call).
//
// That reading is never later than the boot clock's own: the boot clock
// advances at least as fast as the monotonic one (it also counts a
// suspend). A renewal's Sent may be taken earlier than the truth (the
// lease then ends earlier); a validity check is exact but for a suspend
// within one turn of the loop, which a benchmark does not do.
//
// A validity check is taken both before and after each grant is recorded,
// so a lapse that the grant itself ends is counted too (the per-connection
// transports check only after it).
type renewLoop struct {
	p     *loadProc
	epfd  int
	wake  [2]int // a pipe: a byte on wake[1] wakes the loop for its commands
	addrs []unix.Sockaddr

	mu   sync.Mutex
	cmds []loopCmd
	dead chan struct{} // closed when the loop has ended
	// stopping ends the loop at its next turn (Close).
	stopping atomic.Bool

	byFd   []*epSession
	timers timerHeap
	fw     fdWriter
	w      *renewframe.Writer
	req    waldenv1.RenewLeasesRequest
	ans    waldenv1.RenewLeasesResponse
	buf    []byte
	base   time.Time
	boot0  time.Duration // the boot clock at the start of this turn
	mono0  time.Duration // and the monotonic clock (since base)
}

// loopCmd adds an agent's registration to the loop or removes it; done is
// closed once the loop has done it.
type loopCmd struct {
	ag     *epAgent
	remove bool
	done   chan struct{}
}

// epAgent is one registration of an agent, renewed with every coordinator.
type epAgent struct {
	a     *simAgent
	epoch uint64
	sess  []*epSession
	// refused is closed when a coordinator refused the epoch for good
	// (the agent registers again).
	refused chan struct{}
}

// The states of a session.
const (
	idle       = iota // waiting for its next attempt (its timer)
	connecting        // an attempt waiting for the connection to open
	waiting           // an attempt waiting for its answer
)

// epSession is an agent's renewals with one coordinator.
type epSession struct {
	ag    *epAgent
	i     int // the coordinator's index
	fd    int // -1 without a connection
	state int
	seq   uint64
	ttl   time.Duration
	// voters and conf are the voters the connection sent last, and their
	// configuration's index.
	voters lease.Voters
	conf   uint64
	// pending holds the start of a frame that has not fully arrived.
	pending  []byte
	sent     time.Duration // the boot clock before the attempt
	start    time.Duration // the monotonic clock when it was sent
	failures int
	due      time.Duration // its timer, on the monotonic clock
	hidx     int           // its index in the timer heap, -1 when not there
}

func newRenewLoop(p *loadProc) (*renewLoop, error) {
	l := &renewLoop{p: p, dead: make(chan struct{}), buf: make([]byte, 64<<10), base: time.Now()}
	for _, c := range p.cfg.Coordinators {
		ta, err := net.ResolveTCPAddr("tcp4", c)
		if err != nil || ta.IP.To4() == nil {
			return nil, fmt.Errorf("load: frames-epoll needs IPv4 coordinator addresses, not %q", c)
		}
		l.addrs = append(l.addrs, &unix.SockaddrInet4{Port: ta.Port, Addr: [4]byte(ta.IP.To4())})
	}
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("load: epoll: %w", err)
	}
	if err := unix.Pipe2(l.wake[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		_ = unix.Close(l.epfd)
		return nil, fmt.Errorf("load: pipe: %w", err)
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.wake[0], &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.wake[0])}); err != nil {
		l.closeFds()
		return nil, fmt.Errorf("load: epoll: %w", err)
	}
	l.w = renewframe.NewWriter(&l.fw, renewframe.MaxRequest)
	return l, nil
}

// Close ends the loop and then closes its epoll set and pipe: closed
// under a running loop, their numbers could go to another loop's, whose
// events this one would take.
func (l *renewLoop) Close() {
	l.stopping.Store(true)
	_, _ = unix.Write(l.wake[1], []byte{0})
	<-l.dead
	l.closeFds()
}

func (l *renewLoop) closeFds() {
	_ = unix.Close(l.wake[0])
	_ = unix.Close(l.wake[1])
	_ = unix.Close(l.epfd)
}

// renew renews epoch for a until ctx ends or a coordinator refuses the
// epoch for good; it reports the latter.
func (l *renewLoop) renew(ctx context.Context, a *simAgent, epoch uint64, ttl time.Duration) bool {
	ag := &epAgent{a: a, epoch: epoch, refused: make(chan struct{})}
	for i := range l.addrs {
		ag.sess = append(ag.sess, &epSession{ag: ag, i: i, fd: -1, ttl: ttl, hidx: -1})
	}
	l.do(loopCmd{ag: ag})
	select {
	case <-ag.refused:
		return true
	case <-ctx.Done():
		l.do(loopCmd{ag: ag, remove: true})
		return false
	case <-l.dead:
		// The loop ended (epoll failed, said on stdout): the agent waits
		// for its end rather than registering again and again.
		<-ctx.Done()
		return false
	}
}

// do hands c to the loop and waits until it is done.
func (l *renewLoop) do(c loopCmd) {
	c.done = make(chan struct{})
	l.mu.Lock()
	l.cmds = append(l.cmds, c)
	l.mu.Unlock()
	_, _ = unix.Write(l.wake[1], []byte{0}) // a full pipe wakes it as well
	select {
	case <-c.done:
	case <-l.dead:
	}
}

func (l *renewLoop) mono() time.Duration { return time.Since(l.base) }

// bootNow is the boot clock now, from this turn's reading and the
// monotonic clock since (see renewLoop).
func (l *renewLoop) bootNow() time.Duration { return l.boot0 + l.mono() - l.mono0 }

// run is the loop; it returns when epoll fails or Close ends it.
func (l *renewLoop) run() {
	defer close(l.dead)
	events := make([]unix.EpollEvent, 512)
	for !l.stopping.Load() {
		timeout := 1000
		if len(l.timers) > 0 {
			d := l.timers[0].due - l.mono()
			timeout = min(max(int((d+time.Millisecond-1)/time.Millisecond), 0), 1000)
		}
		n, err := unix.EpollWait(l.epfd, events, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			l.p.send(reply{Op: "error", Error: fmt.Sprintf("load: epoll: %v", err)})
			return
		}
		l.boot0, l.mono0 = lease.BootClock.Now(), l.mono()
		for _, ev := range events[:max(n, 0)] {
			fd := int(ev.Fd)
			if fd == l.wake[0] {
				l.commands()
				continue
			}
			// A session closed earlier in this turn may leave an event of
			// its fd behind; no socket opens before the timers below.
			s := l.session(fd)
			if s == nil {
				continue
			}
			if s.state == connecting && ev.Events&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
				l.connected(s)
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
				l.readable(s)
			}
		}
		now := l.mono()
		for len(l.timers) > 0 && l.timers[0].due <= now {
			s := heap.Pop(&l.timers).(*epSession)
			if s.state == idle {
				l.attempt(s)
			} else {
				l.lost(s, status.Error(codes.DeadlineExceeded, "renewal: no answer from the coordinator in time"))
			}
		}
	}
}

func (l *renewLoop) session(fd int) *epSession {
	if fd < len(l.byFd) {
		return l.byFd[fd]
	}
	return nil
}

// commands adds and removes the registrations handed over.
func (l *renewLoop) commands() {
	var b [64]byte
	for {
		if n, _ := unix.Read(l.wake[0], b[:]); n < len(b) {
			break
		}
	}
	l.mu.Lock()
	cmds := l.cmds
	l.cmds = nil
	l.mu.Unlock()
	now := l.mono()
	for _, c := range cmds {
		for _, s := range c.ag.sess {
			if c.remove {
				l.closeConn(s)
				if s.hidx >= 0 {
					heap.Remove(&l.timers, s.hidx)
				}
				continue
			}
			// Start at a random point of the period: agents that start
			// together do not renew in lock-step.
			l.schedule(s, now+rand.N(s.ttl/3))
		}
		close(c.done)
	}
}

func (l *renewLoop) schedule(s *epSession, due time.Duration) {
	s.due = due
	if s.hidx >= 0 {
		heap.Fix(&l.timers, s.hidx)
	} else {
		heap.Push(&l.timers, s)
	}
}

func perTry(ttl time.Duration) time.Duration { return max(ttl/6, 50*time.Millisecond) }

// attempt sends the next renewal, opening the connection first if there
// is none.
func (l *renewLoop) attempt(s *epSession) {
	s.sent, s.start = l.bootNow(), l.mono()
	if s.fd >= 0 {
		l.send(s)
		return
	}
	fd, err := l.dial(s)
	if err != nil {
		l.failed(s, status.Errorf(codes.Unavailable, "renewal: cannot connect to the coordinator at %s: connection error: %v", l.p.cfg.Coordinators[s.i], err))
		return
	}
	s.fd, s.state = fd, connecting
	for len(l.byFd) <= fd {
		l.byFd = append(l.byFd, nil)
	}
	l.byFd[fd] = s
	l.schedule(s, s.start+perTry(s.ttl))
}

// dial starts a non-blocking connection from the agent's own address to
// the coordinator, watched by the loop's epoll set.
func (l *renewLoop) dial(s *epSession) (int, error) {
	ip := net.ParseIP(s.ag.a.b.IP).To4()
	if ip == nil {
		return -1, fmt.Errorf("frames-epoll needs an IPv4 agent address, not %q", s.ag.a.b.IP)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	// As Go's net package dials: no Nagle delay on the small frames.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err == nil {
		err = unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte(ip)})
	}
	if err == nil {
		if err = unix.Connect(fd, l.addrs[s.i]); errors.Is(err, unix.EINPROGRESS) {
			err = nil
		}
	}
	if err == nil {
		err = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP, Fd: int32(fd)})
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// connected finishes a connection that opened (or failed to) and sends the
// preface and the attempt's renewal.
func (l *renewLoop) connected(s *epSession) {
	if soerr, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
		if err == nil {
			err = unix.Errno(soerr)
		}
		l.lost(s, status.Errorf(codes.Unavailable, "renewal: cannot connect to the coordinator at %s: connection error: %v", l.p.cfg.Coordinators[s.i], err))
		return
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, s.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(s.fd)}); err != nil {
		l.lost(s, status.Errorf(codes.Unavailable, "renewal: connection error: %v", err))
		return
	}
	l.fw.fd = s.fd
	if _, err := l.fw.Write([]byte(renewframe.Preface)); err != nil {
		l.lost(s, status.Errorf(codes.Unavailable, "renewal: connection error: %v", err))
		return
	}
	s.seq, s.voters, s.conf, s.pending = 0, lease.Voters{}, 0, s.pending[:0]
	l.send(s)
}

// send writes the attempt's renewal on an open connection.
func (l *renewLoop) send(s *epSession) {
	s.seq++
	l.req = waldenv1.RenewLeasesRequest{BrokerId: s.ag.a.b.ID, Epoch: s.ag.epoch, Seq: s.seq}
	l.fw.fd = s.fd
	if err := l.w.Write(&l.req); err != nil {
		l.lost(s, status.Errorf(codes.Unavailable, "renewal: connection error: %v", err))
		return
	}
	s.state = waiting
	l.schedule(s, s.start+perTry(s.ttl))
}

// readable reads what arrived on s's connection and takes every whole
// answer in it.
func (l *renewLoop) readable(s *epSession) {
	n, err := unix.Read(s.fd, l.buf)
	switch {
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
		return
	case err == nil && n == 0:
		err = io.EOF
	}
	if err != nil {
		l.broken(s, err)
		return
	}
	data := l.buf[:n]
	if len(s.pending) > 0 {
		s.pending = append(s.pending, data...)
		data = s.pending
	}
	for len(data) >= 4 {
		size := binary.BigEndian.Uint32(data)
		if size > renewframe.MaxResponse {
			l.broken(s, fmt.Errorf("%w: %d bytes announced, at most %d taken", renewframe.ErrTooLarge, size, renewframe.MaxResponse))
			return
		}
		if uint64(len(data)) < 4+uint64(size) {
			break
		}
		l.ans.Reset()
		if err := proto.Unmarshal(data[4:4+size], &l.ans); err != nil {
			l.broken(s, fmt.Errorf("%w: %v", renewframe.ErrMalformed, err))
			return
		}
		data = data[4+size:]
		if l.answer(s) {
			return // the connection or the registration ended
		}
	}
	s.pending = append(s.pending[:0], data...)
}

// broken ends a connection that failed or that the coordinator ended; an
// attempt waiting on it fails, a session between attempts opens another at
// its next.
func (l *renewLoop) broken(s *epSession, err error) {
	if s.state == idle {
		l.closeConn(s)
		return
	}
	msg := "renewal: connection error: " + err.Error()
	if errors.Is(err, io.EOF) {
		msg = "renewal: the coordinator closed the connection"
	}
	l.lost(s, status.Error(codes.Unavailable, msg))
}

// answer takes l.ans, an answer on s's connection; it reports whether it
// ended the connection or the registration.
func (l *renewLoop) answer(s *epSession) bool {
	a := &l.ans
	// A grant that leaves the voters out means the voters the connection
	// sent last, whether or not anyone waits for it.
	var voters lease.Voters
	if g := a.GetGrant(); g != nil {
		switch {
		case len(g.GetVoters()) > 0:
			s.voters, s.conf = votersOf(g), g.GetConfIndex()
			voters = s.voters
		case g.GetConfIndex() == s.conf:
			voters = s.voters
		default:
			voters = lease.Voters{Index: g.GetConfIndex()}
		}
	}
	if s.state != waiting || (a.GetSeq() != s.seq && (a.GetSeq() != 0 || a.GetRefusal() == nil)) {
		return false // the late answer of an attempt given up on
	}
	if f := a.GetRefusal(); f != nil {
		err := refusalError(f)
		if reason := string(rpcerr.Reason(err)); refusedForGood(reason) {
			l.p.refuse(reason)
			l.endRegistration(s.ag)
			return true
		}
		closed := codes.Code(f.GetCode()) == codes.PermissionDenied // the coordinator ends the connection after it
		if closed {
			l.closeConn(s)
		}
		l.failed(s, err)
		return closed
	}
	g := a.GetGrant()
	if g == nil {
		l.lost(s, status.Error(codes.Internal, "renewal: an answer with neither a grant nor a refusal"))
		return true
	}
	now := l.mono()
	l.p.granted[s.i].Add(1)
	l.p.latency[bucket(now-s.start)].Add(1)
	if t := time.Duration(g.GetLeaseTtlMs()) * time.Millisecond; t > 0 {
		s.ttl = t
	}
	boot := l.bootNow()
	ag := s.ag.a
	ag.mu.Lock()
	ag.noteValidityLocked(boot) // a lapse this grant ends is a lapse
	ag.holder.Granted(lease.Grant{Coordinator: g.GetCoordinatorId(), Epoch: s.ag.epoch, Sent: s.sent, TTL: s.ttl}, voters)
	ag.noteValidityLocked(boot)
	ag.mu.Unlock()
	s.failures, s.state = 0, idle
	wait := lease.NextRenewal(s.ttl, boot-s.sent, time.Duration(g.GetRenewInUs())*time.Microsecond)
	l.schedule(s, now+max(wait, time.Millisecond))
	return false
}

func votersOf(g *waldenv1.RenewLeaseResponse) lease.Voters {
	v := lease.Voters{Index: g.GetConfIndex()}
	for _, m := range g.GetVoters() {
		v.IDs = append(v.IDs, m.GetId())
		v.Incarnations = append(v.Incarnations, m.GetIncarnation())
	}
	return v
}

// lost ends an attempt whose connection failed, or gave no answer in time
// (a read cut by then may have taken part of a frame): the connection is
// closed and the next attempt opens another.
func (l *renewLoop) lost(s *epSession, err error) {
	l.closeConn(s)
	l.failed(s, err)
}

// failed ends an attempt that got no grant; the next waits as package
// agent's would.
func (l *renewLoop) failed(s *epSession, err error) {
	s.failures++
	wait := l.p.failure(err, s.failures, s.ttl)
	a := s.ag.a
	a.mu.Lock()
	a.noteValidityLocked(l.bootNow())
	a.mu.Unlock()
	s.state = idle
	l.schedule(s, l.mono()+max(wait, time.Millisecond))
}

// endRegistration closes every connection of ag and tells its agent to
// register again.
func (l *renewLoop) endRegistration(ag *epAgent) {
	a := ag.a
	a.mu.Lock()
	a.holder.Revoke()
	a.wasValid = false
	a.mu.Unlock()
	for _, s := range ag.sess {
		l.closeConn(s)
		s.state = idle
		if s.hidx >= 0 {
			heap.Remove(&l.timers, s.hidx)
		}
	}
	// Its connections are closed and its timers gone: no answer of it
	// reaches the loop again, so this runs once per registration.
	close(ag.refused)
}

func (l *renewLoop) closeConn(s *epSession) {
	if s.fd >= 0 {
		l.byFd[s.fd] = nil
		_ = unix.Close(s.fd) // closing also takes it out of the epoll set
		s.fd = -1
		s.pending = s.pending[:0]
	}
}

// fdWriter writes to a non-blocking socket: a frame is small and written
// whole or not at all, as the renewals leave its buffer nearly empty.
type fdWriter struct{ fd int }

func (w *fdWriter) Write(b []byte) (int, error) {
	for {
		n, err := unix.Write(w.fd, b)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return 0, err
		case n < len(b):
			return n, io.ErrShortWrite
		}
		return n, nil
	}
}

// timerHeap orders sessions by their timers.
type timerHeap []*epSession

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *timerHeap) Push(x any) {
	s := x.(*epSession)
	s.hidx = len(*h)
	*h = append(*h, s)
}
func (h *timerHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.hidx = -1
	return s
}
