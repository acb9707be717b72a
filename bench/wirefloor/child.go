package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	waldenv1 "walden/proto/walden/v1"
)

// The raw transport's frame: a 2-byte big-endian length, then the payload.
// A request's payload is the sequence number (8 bytes), an epoch (8) and a
// broker id (12); an answer's is the sequence number, an epoch and a lease
// in milliseconds (8 each) and 4 bytes of padding: about the size of the
// protobuf messages of the grpc transports (see protoSizes).
const (
	framePayload = 28
	frameSize    = 2 + framePayload
)

// The flow-control windows and read buffer of walden's admin server
// (server/grpc.go) and the agent's window (agent/renewal.go).
const (
	serverStreamWindow = 1 << 20
	serverConnWindow   = 4 << 20
	serverReadBuffer   = 4 << 10
	agentWindow        = 64 << 10
)

// childOptions are the flags of a child process.
type childOptions struct {
	serve, client string // the transport
	addr          string
	cert, key     string
	conns         int // this process's connections
	first, total  int // its first connection's index among all of the run's
	slot          time.Duration
	rate          float64
	lifetime      time.Duration
}

// isChild reports whether args make this process a child: a server or a
// client.
func isChild(args []string) bool {
	return len(args) > 0 && (args[0] == "-serve" || args[0] == "-client")
}

// runChild runs a server (-serve) or a client process (-client). It talks
// to the process that started it in lines: on stdout the server writes
// "addr HOST:PORT" once it listens, a client "ready" once all its
// connections are open (or "error ..." if they cannot be); on stdin they
// are asked "count" (answered "count ANSWERED" by the server, "count SENT
// ANSWERED LATE" by a client), a client is told "go UNIXNANO" (when to
// start sending), and the end of stdin ends them. Every child also ends
// after -lifetime, whatever it is told.
func runChild(args []string, stdout, stderr io.Writer) error {
	var o childOptions
	fs := flag.NewFlagSet("wirefloor child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.serve, "serve", "", "serve this transport")
	fs.StringVar(&o.client, "client", "", "open client connections of this transport")
	fs.StringVar(&o.addr, "addr", "", "the server's address (clients)")
	fs.StringVar(&o.cert, "cert", "", "PEM certificate (the server's; the clients' root)")
	fs.StringVar(&o.key, "key", "", "PEM key of -cert (server)")
	fs.IntVar(&o.conns, "conns", 1, "connections of this process (clients)")
	fs.IntVar(&o.first, "first", 0, "index of this process's first connection among all (clients)")
	fs.IntVar(&o.total, "total", 1, "connections of the run (clients)")
	fs.DurationVar(&o.slot, "slot", 0, "send slot (clients): 0 spreads the sends evenly over each period, d > 0 sends those of each d together")
	fs.Float64Var(&o.rate, "rate", 1, "requests per second per connection")
	fs.DurationVar(&o.lifetime, "lifetime", time.Minute, "the process ends after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.rate <= 0 || o.lifetime <= 0 || o.conns < 1 || o.total < o.first+o.conns || o.slot < 0 {
		return fmt.Errorf("wirefloor child: bad -rate %v, -lifetime %v, -conns %d, -first %d, -total %d or -slot %v", o.rate, o.lifetime, o.conns, o.first, o.total, o.slot)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.lifetime)
	defer cancel()
	if o.serve != "" {
		return serve(ctx, cancel, o, stdout)
	}
	return clients(ctx, cancel, o, stdout)
}

// maxMessages bounds the messages of one connection over the process's
// lifetime, with room for the sends of a late start.
func (o childOptions) maxMessages() int {
	return int(math.Ceil(o.rate*o.lifetime.Seconds())) + 16
}

// commands reads the parent's lines from stdin and calls do with each; the
// end of stdin cancels the process.
func commands(cancel context.CancelFunc, do func(cmd string, args []string)) {
	go func() {
		defer cancel()
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) > 0 {
				do(f[0], f[1:])
			}
		}
	}()
}

// serve listens on 127.0.0.1 (port 0) and answers until ctx ends.
func serve(ctx context.Context, cancel context.CancelFunc, o childOptions, stdout io.Writer) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	out := &lockedWriter{w: stdout} // a line in one write
	var answered atomic.Uint64
	commands(cancel, func(cmd string, _ []string) {
		if cmd == "count" {
			fmt.Fprintf(out, "count %d\n", answered.Load())
		}
	})
	switch o.serve {
	case "raw", "raw-tls":
		if o.serve == "raw-tls" {
			cert, err := tls.LoadX509KeyPair(o.cert, o.key)
			if err != nil {
				return err
			}
			lis = tls.NewListener(lis, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		}
		go func() { <-ctx.Done(); lis.Close() }()
		fmt.Fprintf(out, "addr %s\n", lis.Addr())
		return serveRaw(ctx, lis, o, &answered)
	case "grpc", "grpc-tls":
		creds := insecure.NewCredentials()
		if o.serve == "grpc-tls" {
			cert, err := tls.LoadX509KeyPair(o.cert, o.key)
			if err != nil {
				return err
			}
			creds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		}
		s := grpc.NewServer(
			grpc.Creds(creds),
			grpc.InitialWindowSize(serverStreamWindow),
			grpc.InitialConnWindowSize(serverConnWindow),
			grpc.ReadBufferSize(serverReadBuffer),
			grpc.SharedWriteBuffer(true),
		)
		waldenv1.RegisterAgentServer(s, &fixedGrant{answered: &answered, max: o.maxMessages(), grant: grant()})
		go func() { <-ctx.Done(); s.Stop() }()
		fmt.Fprintf(out, "addr %s\n", lis.Addr())
		if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	default:
		return fmt.Errorf("wirefloor: -serve %q: not one of raw, raw-tls, grpc, grpc-tls", o.serve)
	}
}

// serveRaw answers every frame of every connection with a frame of the
// same size carrying the request's sequence number: one goroutine per
// connection, one read and one write per message (while the client waits
// for each answer before it sends again).
func serveRaw(ctx context.Context, lis net.Listener, o childOptions, answered *atomic.Uint64) error {
	deadline, _ := ctx.Deadline()
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(deadline)
			r := bufio.NewReaderSize(c, 64)
			var req [frameSize]byte
			resp := answerFrame()
			for range o.maxMessages() {
				if _, err := io.ReadFull(r, req[:]); err != nil {
					return
				}
				if binary.BigEndian.Uint16(req[:2]) != framePayload {
					return
				}
				copy(resp[2:10], req[2:10])
				if _, err := c.Write(resp[:]); err != nil {
					return
				}
				answered.Add(1)
			}
		}()
	}
}

// requestFrame is a raw request with sequence number seq.
func requestFrame(seq uint64) [frameSize]byte {
	var f [frameSize]byte
	binary.BigEndian.PutUint16(f[:2], framePayload)
	binary.BigEndian.PutUint64(f[2:10], seq)
	binary.BigEndian.PutUint64(f[10:18], 7)
	copy(f[18:], "broker-00001")
	return f
}

// answerFrame is a raw answer, its sequence number to be set.
func answerFrame() [frameSize]byte {
	var f [frameSize]byte
	binary.BigEndian.PutUint16(f[:2], framePayload)
	binary.BigEndian.PutUint64(f[10:18], 7)
	binary.BigEndian.PutUint64(f[18:26], 6000)
	return f
}

// fixedGrant is an Agent server whose renewal stream answers every request
// with the same grant and the request's sequence number.
type fixedGrant struct {
	waldenv1.UnimplementedAgentServer
	answered *atomic.Uint64
	max      int
	grant    *waldenv1.RenewLeaseResponse
}

func (f *fixedGrant) RenewLeases(stream waldenv1.Agent_RenewLeasesServer) error {
	for range f.max {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.Send(&waldenv1.RenewLeasesResponse{Seq: req.GetSeq(), Grant: f.grant}); err != nil {
			return err
		}
		f.answered.Add(1)
	}
	return nil
}

// grant is the fixed grant: what a coordinator answers a renewal once the
// stream has its voters.
func grant() *waldenv1.RenewLeaseResponse {
	return &waldenv1.RenewLeaseResponse{Epoch: 7, LeaseTtlMs: 6000, LeaderId: "coord-1", CoordinatorId: "coord-1", ConfIndex: 3}
}

// renewal is the request of the grpc transports.
func renewal(seq uint64) *waldenv1.RenewLeasesRequest {
	return &waldenv1.RenewLeasesRequest{BrokerId: "broker-00001", Epoch: 7, Seq: seq}
}

// exchanger sends one request on a connection and waits for its answer.
type exchanger interface {
	exchange(seq uint64) error
	close()
}

type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

func (rc *rawConn) exchange(seq uint64) error {
	req := requestFrame(seq)
	if _, err := rc.c.Write(req[:]); err != nil {
		return err
	}
	var resp [frameSize]byte
	if _, err := io.ReadFull(rc.r, resp[:]); err != nil {
		return err
	}
	if got := binary.BigEndian.Uint64(resp[2:10]); got != seq {
		return fmt.Errorf("answer %d to request %d", got, seq)
	}
	return nil
}

func (rc *rawConn) close() { rc.c.Close() }

type grpcConn struct {
	cc     *grpc.ClientConn
	stream waldenv1.Agent_RenewLeasesClient
}

func (gc *grpcConn) exchange(seq uint64) error {
	if err := gc.stream.Send(renewal(seq)); err != nil {
		return err
	}
	resp, err := gc.stream.Recv()
	if err != nil {
		return err
	}
	if resp.GetSeq() != seq || resp.GetGrant() == nil {
		return fmt.Errorf("answer %d to request %d", resp.GetSeq(), seq)
	}
	return nil
}

func (gc *grpcConn) close() { gc.cc.Close() }

// dial opens one connection of transport o.client and exchanges a first
// message on it, so that it is open when dial returns.
func dial(ctx context.Context, o childOptions, roots *x509.CertPool) (exchanger, error) {
	var x exchanger
	switch o.client {
	case "raw", "raw-tls":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", o.addr)
		if err != nil {
			return nil, err
		}
		if o.client == "raw-tls" {
			tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			c = tc
		}
		deadline, _ := ctx.Deadline()
		_ = c.SetDeadline(deadline)
		x = &rawConn{c: c, r: bufio.NewReaderSize(c, 64)}
	case "grpc", "grpc-tls":
		creds := insecure.NewCredentials()
		if o.client == "grpc-tls" {
			creds = credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		}
		cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(creds),
			grpc.WithInitialWindowSize(agentWindow), grpc.WithInitialConnWindowSize(agentWindow))
		if err != nil {
			return nil, err
		}
		stream, err := waldenv1.NewAgentClient(cc).RenewLeases(ctx)
		if err != nil {
			cc.Close()
			return nil, err
		}
		x = &grpcConn{cc: cc, stream: stream}
	default:
		return nil, fmt.Errorf("wirefloor: -client %q: not one of raw, raw-tls, grpc, grpc-tls", o.client)
	}
	if err := x.exchange(0); err != nil {
		x.close()
		return nil, err
	}
	return x, nil
}

// clients opens o.conns connections, says "ready", and on "go T" sends on
// each one request every 1/o.rate seconds from T, connection i of the run
// offset by sendOffset, until ctx ends or it has sent maxMessages.
func clients(ctx context.Context, cancel context.CancelFunc, o childOptions, stdout io.Writer) error {
	out := &lockedWriter{w: stdout} // a line in one write
	var sent, answered, late atomic.Uint64
	start := make(chan time.Time, 1)
	commands(cancel, func(cmd string, args []string) {
		switch cmd {
		case "count":
			fmt.Fprintf(out, "count %d %d %d\n", sent.Load(), answered.Load(), late.Load())
		case "go":
			if len(args) == 1 {
				if ns, err := strconv.ParseInt(args[0], 10, 64); err == nil {
					select {
					case start <- time.Unix(0, ns):
					default:
					}
				}
			}
		}
	})
	var roots *x509.CertPool
	if o.client == "grpc-tls" || o.client == "raw-tls" {
		pem, err := os.ReadFile(o.cert)
		if err != nil {
			return err
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("wirefloor: %s: no certificate", o.cert)
		}
	}
	conns := make([]exchanger, 0, o.conns)
	defer func() {
		for _, c := range conns {
			c.close()
		}
	}()
	// Open the connections a few at a time: the server's accept queue is
	// finite, and a TLS handshake costs both sides.
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for range o.conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			x, err := dial(ctx, o, roots)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = cmp(firstErr, err)
				return
			}
			conns = append(conns, x)
		})
	}
	wg.Wait()
	if firstErr != nil {
		fmt.Fprintf(out, "error %d of %d connections open: %v\n", len(conns), o.conns, strings.ReplaceAll(firstErr.Error(), "\n", " "))
		return firstErr
	}
	fmt.Fprintf(out, "ready\n")
	var t0 time.Time
	select {
	case t0 = <-start:
	case <-ctx.Done():
		return nil
	}
	period := periodOf(o.rate)
	for i, c := range conns {
		offset := sendOffset(o.first+i, o.total, period, o.slot)
		wg.Go(func() { load(ctx, c, t0.Add(offset), period, o.maxMessages(), &sent, &answered, &late) })
	}
	wg.Wait()
	return nil
}

// sendOffset is when connection i of n sends within each period: i/n of
// the period, the sends spread evenly over it (slot 0), or that rounded
// down to a multiple of slot, so that the connections of a slot send
// together at its start (as agents renew at a coordinator's renewal slots).
func sendOffset(i, n int, period, slot time.Duration) time.Duration {
	even := time.Duration(int64(period) * int64(i) / int64(n))
	if slot <= 0 {
		return even
	}
	return even - even%slot
}

// cmp keeps the first error.
func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// load sends on c one request every period from next, waiting for each
// answer, until ctx ends, an exchange fails or it has sent max. A send more
// than a period behind its time is counted late and the schedule restarts
// from now (it does not catch up in a burst).
func load(ctx context.Context, c exchanger, next time.Time, period time.Duration, max int, sent, answered, late *atomic.Uint64) {
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for seq := uint64(1); seq <= uint64(max); seq++ {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		sent.Add(1)
		if err := c.exchange(seq); err != nil {
			return
		}
		answered.Add(1)
		next = next.Add(period)
		if now := time.Now(); now.Sub(next) > period {
			late.Add(1)
			next = now
		}
		timer.Reset(time.Until(next))
	}
}
