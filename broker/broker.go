package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"walden/agent"
	"walden/authz"
	"walden/config"
	"walden/connlimit"
	"walden/mtls"
	"walden/objstore"
	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/wal"
)

// Options are the parts of a Broker that are not configuration.
type Options struct {
	// Logger receives the broker's structured log; nil discards it.
	Logger *slog.Logger
	// Agent tunes the embedded agent (its Logger defaults to Logger).
	Agent agent.Options
	// S3 tunes the S3 client (its Logger defaults to Logger).
	S3 objstore.Options
	// DialOptions are the options of the catalog connections; default
	// the tls keys' mutual TLS, or plain gRPC without them.
	DialOptions []grpc.DialOption
	// ListenerMetrics, when set, counts what the data API's limits
	// (limits.api) refused; the embedded agent's endpoint counts in
	// Agent.ListenerMetrics.
	ListenerMetrics *connlimit.Metrics
	// ServerOptions are added to the data API's gRPC server (e.g. metrics
	// interceptors).
	ServerOptions []grpc.ServerOption
	// PollOnly makes the broker learn that streams closed by polling the
	// catalog every takeover_interval only, without watching the
	// coordinators' state (for the benchmark that compares the two).
	PollOnly bool
	// Hooks hold the broker at points a test must reach exactly; none in
	// production.
	Hooks Hooks
}

// Hooks run at points of the broker's work that a test holds it at, to
// kill or stop it there. Each runs on the goroutine of the work it
// interrupts, which waits for it to return.
type Hooks struct {
	// AppendAdmitted runs in Append once the request was admitted (ready,
	// lease valid), before its WAL write.
	AppendAdmitted func()
	// AppendDurable runs in Append once the batch is durable in the WAL,
	// before it is acknowledged.
	AppendDurable func()
	// Drained runs in a graceful stop once nothing is pending, before the
	// streams close.
	Drained func()
}

// Broker is one reference broker. Create it with New, then Start (or Run).
type Broker struct {
	cfg    *config.Broker
	log    *slog.Logger
	opts   Options
	coords *Coordinators
	s3     *objstore.Client
	agent  *agent.Agent
	ln     net.Listener
	addr   string
	grpc   *grpc.Server
	// creds secure the data API: mutual TLS with tls set, else plain.
	creds credentials.TransportCredentials
	reads *indexCache

	// walMu is held shared by appends (from the WAL write to the pending
	// list) and exclusively by the upload's snapshot, so that a snapshot
	// sees every record the WAL made durable before it.
	walMu sync.RWMutex

	mu       sync.Mutex
	inc      *incarnation // nil while not serving
	running  *epochRun    // the epoch being recovered or served
	draining bool
	uploads  uint64
	lastErr  string

	kick chan struct{}
	// closed holds the ids of streams the watch saw closed, for the serving
	// loop to open (reopen kicks it); watchSeen is when the watch last
	// answered (UnixNano; 0: never), which makes polling the fallback.
	closedMu  sync.Mutex
	closed    map[uint64]bool
	reopen    chan struct{}
	watchSeen atomic.Int64

	cancel  context.CancelFunc
	done    chan struct{}
	stopMu  sync.Mutex
	stopped bool
}

// incarnation is the broker's state under one broker epoch.
type incarnation struct {
	epoch   uint64
	w       *wal.Writer
	streams map[uint64]*ownedStream
	// pending holds the WAL records not yet committed, in WAL order.
	pending      []pendingRecord
	pendingBytes int64
	// upload is the object being uploaded and committed; it is retried
	// unchanged until committed, so that a retry commits the same id.
	upload *builtObject
	fenced bool
	// maintRounds counts maintain's rounds (the serving loop's only).
	maintRounds int
}

type ownedStream struct {
	mu    sync.Mutex
	id    uint64
	epoch uint64
	next  uint64 // offset of the next append; guarded by mu
	lost  bool   // the incarnation ended; refuse appends; guarded by mu
	// producers holds the last batch of each idempotent producer, durable
	// in the WAL or committed; guarded by mu.
	producers *producer.Table
	// committed is the catalog's end offset; changed under Broker.mu
	// together with the pending list, so that a reader holding Broker.mu
	// sees every offset either committed or pending.
	committed atomic.Uint64
}

type pendingRecord struct {
	walOffset int64
	batch     wal.Batch
}

// New checks cfg and builds the broker without starting anything.
func New(cfg *config.Broker, opts Options) (*Broker, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Agent.Logger == nil {
		opts.Agent.Logger = opts.Logger
	}
	if opts.S3.Logger == nil {
		opts.S3.Logger = opts.Logger
	}
	// With tls set the data API serves mutual TLS with the broker's
	// certificate, and the catalog connections present it.
	tlsCfg, err := mtls.Load(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	// The catalog lets a broker write the streams of the broker id its
	// certificate names.
	if err := mtls.CheckIdentity(cfg.TLS, authz.Identity{Role: authz.RoleBroker, BrokerID: cfg.BrokerID}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if len(opts.DialOptions) == 0 {
		opts.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(mtls.Creds(tlsCfg.Client))}
	}
	return &Broker{
		cfg:    cfg,
		creds:  mtls.Creds(tlsCfg.Server),
		log:    opts.Logger.With("broker_id", cfg.BrokerID),
		opts:   opts,
		coords: NewCoordinators(cfg.Coordinators, opts.DialOptions...),
		reads:  newIndexCache(),
		kick:   make(chan struct{}, 1),
		closed: map[uint64]bool{},
		reopen: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}, nil
}

// Addr is the bound address of the data API ("" before Start).
func (b *Broker) Addr() string { return b.addr }

// AgentAddr is the bound address of the embedded agent's endpoint.
func (b *Broker) AgentAddr() string {
	if b.agent == nil {
		return ""
	}
	return b.agent.Addr()
}

// Agent returns the embedded agent (nil before Start).
func (b *Broker) Agent() *agent.Agent { return b.agent }

// Start binds the data API, connects to S3, starts the embedded agent and
// serves; registration, recovery of the old WAL and opening the streams
// continue in the background (appends answer NOT_READY until then).
func (b *Broker) Start(ctx context.Context) error {
	s3, err := objstore.New(ctx, b.cfg.S3, b.opts.S3)
	if err != nil {
		return fmt.Errorf("%w: s3: %w", ErrStart, err)
	}
	b.s3 = s3
	if _, err := os.Stat(b.cfg.WAL.Path); err == nil {
		// Refuse to start on a file that is not a WAL, before registering.
		rd, err := wal.Open(b.cfg.WAL.Path)
		if err != nil {
			return fmt.Errorf("%w: wal.path: %w", ErrStart, err)
		}
		_ = rd.Close()
	}
	ln, err := net.Listen("tcp", b.cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: listen %s: %w", ErrStart, b.cfg.Listen, err)
	}
	b.ln = ln
	b.addr = ln.Addr().String()
	advertised := b.cfg.BrokerAddr
	if advertised == "" {
		advertised = b.addr
	}
	a, err := agent.New(b.cfg.AgentConfig(advertised), b.opts.Agent)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	b.agent = a
	a.OnEpochChange(b.onEpoch)
	if err := a.Start(); err != nil {
		_ = ln.Close()
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	// The data API is bounded: connections in all and per source
	// address, handshake time, calls per connection, keepalive pings.
	lim := b.cfg.Limits.API
	ln = b.opts.ListenerMetrics.Listener(ln, connlimit.BrokerAPI, lim.MaxConns, lim.MaxConnsPerSource)
	sopts := append([]grpc.ServerOption{grpc.Creds(b.opts.ListenerMetrics.Creds(connlimit.BrokerAPI, b.creds, b.log.With("component", "listener")))},
		b.opts.ListenerMetrics.ServerOptions(connlimit.BrokerAPI, lim)...)
	b.grpc = grpc.NewServer(append(sopts, b.opts.ServerOptions...)...)
	waldenv1.RegisterBrokerAPIServer(b.grpc, &apiServer{b: b})
	go func() {
		if err := b.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			b.log.Error("broker API stopped", "err", err)
		}
	}()
	rctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	var watching sync.WaitGroup
	if !b.opts.PollOnly {
		watching.Add(1)
		go func() {
			defer watching.Done()
			b.watchClosedStreams(rctx)
		}()
	}
	go func() {
		defer close(b.done)
		b.run(rctx)
		watching.Wait()
	}()
	b.log.Info("broker started", "listen", b.addr, "broker_addr", advertised, "agent", a.Addr(),
		"wal", b.cfg.WAL.Path, "streams", b.cfg.Streams, "takeover", b.cfg.Takeover)
	return nil
}

// Run starts the broker, blocks until ctx ends, then stops gracefully.
func (b *Broker) Run(ctx context.Context) error {
	if err := b.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return b.Stop(true)
}

// Status is what BrokerStatus answers: the epoch, the lease, whether the
// broker serves, its uploads, its WAL backlog and its streams.
func (b *Broker) Status() *waldenv1.BrokerStatusResponse {
	if b.agent == nil {
		return &waldenv1.BrokerStatusResponse{BrokerId: b.cfg.BrokerID}
	}
	resp, _ := (&apiServer{b: b}).BrokerStatus(context.Background(), nil)
	return resp
}

// Ready reports whether the broker accepts appends now.
func (b *Broker) Ready() bool {
	if b.agent == nil {
		return false
	}
	l := b.agent.Lease()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.servesLocked(b.inc, l)
}

// servesLocked reports whether inc accepts appends under lease l: it is
// the incarnation of l's epoch (the serving loop published it once its
// recovery was done, and has not ended it), not fenced, the broker not
// stopping, and the lease valid. b.mu must be held.
func (b *Broker) servesLocked(inc *incarnation, l agent.Lease) bool {
	return inc != nil && inc.epoch == l.Epoch && !inc.fenced && !b.draining && l.Valid && !l.Fenced
}

// run drives incarnations: each registered epoch recovers and serves until
// the cluster fences it, then the next epoch starts over.
func (b *Broker) run(ctx context.Context) {
	var last uint64
	for ctx.Err() == nil {
		lease, err := b.agent.WaitRegistered(ctx)
		if err != nil {
			return
		}
		if lease.Epoch <= last {
			// The agent has not noticed the fencing yet; wait for its new
			// epoch.
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		err = b.serveEpoch(ctx, lease.Epoch)
		if err == nil || ctx.Err() != nil {
			return // stopping
		}
		if errors.Is(err, ErrFenced) {
			b.log.Warn("broker epoch ended", "epoch", lease.Epoch, "err", err)
			last = lease.Epoch
			continue
		}
		// Another failure (the WAL could not be opened): try the same
		// epoch again.
		b.log.Error("broker cannot serve; retrying", "epoch", lease.Epoch, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// serveEpoch recovers the old WAL under epoch, opens the WAL writer and the
// streams, and serves until the epoch is fenced or ctx ends (then the
// caller's Stop finishes the shutdown). Its work runs under a context of
// its own that onEpoch cancels once the agent registered a newer epoch, so
// that the old epoch ends at once, also in the middle of a catalog or S3
// call.
func (b *Broker) serveEpoch(ctx context.Context, epoch uint64) error {
	log := b.log.With("epoch", epoch)
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.mu.Lock()
	b.running = &epochRun{epoch: epoch, cancel: cancel}
	b.mu.Unlock()
	// ended tells why the epoch's work stopped: the broker stops (nil), or
	// a newer epoch replaced this one (ErrFenced).
	ended := func() error {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%w: the agent registered an epoch after %d", ErrFenced, epoch)
	}
	var inc *incarnation
	for {
		inc = &incarnation{epoch: epoch, streams: map[uint64]*ownedStream{}}
		err := b.recoverOldWAL(ectx, inc, log)
		if err == nil {
			break
		}
		if ectx.Err() != nil {
			return ended()
		}
		if errors.Is(err, ErrFenced) {
			return err
		}
		log.Warn("recovering the old WAL failed; retrying", "err", err)
		select {
		case <-ectx.Done():
			return ended()
		case <-time.After(500 * time.Millisecond):
		}
	}
	w, err := b.openWAL(epoch)
	if err != nil {
		return err
	}
	inc.w = w
	for _, id := range b.cfg.Streams {
		if _, ok := inc.streams[id]; !ok {
			b.openStream(ectx, inc, id, log)
		}
	}
	b.mu.Lock()
	if b.draining || ectx.Err() != nil {
		draining := b.draining
		b.mu.Unlock()
		_ = w.Close()
		if draining {
			return nil
		}
		return ended()
	}
	b.inc = inc
	b.mu.Unlock()
	log.Info("broker serving", "streams", inc.streamIDs())

	upload := time.NewTicker(b.cfg.UploadInterval)
	defer upload.Stop()
	maint := time.NewTicker(b.cfg.TakeoverInterval)
	defer maint.Stop()
	for {
		select {
		case <-ectx.Done():
			if ctx.Err() != nil {
				return nil
			}
			b.endIfFenced(inc, log)
			return ended()
		case <-upload.C:
		case <-b.kick:
		case <-b.reopen:
			b.openClosed(ectx, inc, log)
			continue
		case <-maint.C:
			b.maintain(ectx, inc, log)
			if !b.endIfFenced(inc, log) {
				continue
			}
			return ErrFenced
		}
		if err := b.uploadOnce(ectx, inc, log); err != nil && errors.Is(err, ErrFenced) {
			b.endIfFenced(inc, log)
			return err
		}
	}
}

// epochRun is the epoch serveEpoch works for, and how to end it.
type epochRun struct {
	epoch  uint64
	cancel context.CancelFunc
}

// onEpoch is the agent's hook for a new registration: the epoch being
// recovered or served, if older, ends now (its appends were refused since
// the lease moved to the new epoch; see checkLease).
func (b *Broker) onEpoch(l agent.Lease) {
	b.mu.Lock()
	r := b.running
	b.mu.Unlock()
	// Only a newer epoch ends it: the hooks run behind the registrations,
	// and an old one's may arrive after the loop moved on.
	if r != nil && l.Epoch > r.epoch {
		b.log.Info("the agent registered a new epoch; ending the old one", "old_epoch", r.epoch, "epoch", l.Epoch)
		r.cancel()
	}
}

// endIfFenced ends inc when it was fenced (by the catalog or the agent):
// no more appends, WAL writer closed. It reports whether inc ended.
func (b *Broker) endIfFenced(inc *incarnation, log *slog.Logger) bool {
	l := b.agent.Lease()
	b.mu.Lock()
	if l.Fenced || l.Epoch != inc.epoch {
		inc.fenced = true
	}
	fenced := inc.fenced
	if fenced && b.inc == inc {
		b.inc = nil
	}
	b.mu.Unlock()
	if !fenced {
		return false
	}
	b.walMu.Lock()
	for _, s := range inc.streams {
		s.mu.Lock()
		s.lost = true
		s.mu.Unlock()
	}
	b.walMu.Unlock()
	if inc.w != nil {
		_ = inc.w.Close()
	}
	log.Warn("broker fenced: refusing appends until it has registered again and recovered", "agent_epoch", l.Epoch)
	return true
}

func (inc *incarnation) streamIDs() []uint64 {
	ids := make([]uint64, 0, len(inc.streams))
	for id := range inc.streams {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// openWAL opens the WAL for appending under epoch, creating it when
// missing. Reopening discards the old records (recoverOldWAL has committed
// those the catalog lacked): the writer starts past them.
func (b *Broker) openWAL(epoch uint64) (*wal.Writer, error) {
	wopts := wal.WriterOptions{Logger: b.log}
	if _, err := os.Stat(b.cfg.WAL.Path); err == nil {
		w, err := wal.OpenWriter(b.cfg.WAL.Path, wal.OpenOptions{NodeEpoch: epoch, WriterOptions: wopts})
		if err != nil {
			return nil, fmt.Errorf("broker: open wal: %w", err)
		}
		return w, nil
	}
	w, err := wal.Create(b.cfg.WAL.Path, wal.CreateOptions{Capacity: b.cfg.WAL.Capacity, NodeEpoch: epoch, WriterOptions: wopts})
	if err != nil {
		return nil, fmt.Errorf("broker: create wal: %w", err)
	}
	return w, nil
}

// openStream asks the catalog to open stream id for this broker. A stream
// another broker holds (STREAM_NOT_CLOSED) is retried by maintain.
func (b *Broker) openStream(ctx context.Context, inc *incarnation, id uint64, log *slog.Logger) bool {
	var resp *waldenv1.OpenStreamResponse
	err := b.coords.Do(ctx, 3*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = waldenv1.NewCatalogClient(conn).OpenStream(ctx, &waldenv1.OpenStreamRequest{
			BrokerId: b.cfg.BrokerID, BrokerEpoch: inc.epoch, StreamId: id})
		return err
	})
	if err != nil {
		switch rpcerr.Reason(err) {
		case refusal.NodeFenced, refusal.EpochExpired:
			b.mu.Lock()
			inc.fenced = true
			b.mu.Unlock()
		case refusal.StreamNotClosed:
			log.Debug("stream held by another broker; will retry", "stream_id", id, "err", err)
		default:
			log.Warn("open stream failed; will retry", "stream_id", id, "err", err)
		}
		return false
	}
	st := resp.GetStream()
	s := &ownedStream{id: id, epoch: st.GetEpoch(), next: st.GetEndOffset(), producers: producer.NewTable(resp.GetProducers())}
	s.committed.Store(st.GetEndOffset())
	b.walMu.Lock()
	if _, ok := inc.streams[id]; ok {
		// Opened already (a retried open of this epoch answers the stream
		// as is): keep the state appends have changed since.
		b.walMu.Unlock()
		return true
	}
	inc.streams[id] = s
	b.walMu.Unlock()
	log.Info("stream opened", "stream_id", id, "stream_epoch", s.epoch, "end_offset", st.GetEndOffset(), "producers", len(resp.GetProducers()))
	return true
}

// maintain retries the configured streams this broker does not hold and,
// with takeover, opens CLOSED streams. While the watch answers, it learns of
// closed streams from it (openClosed) and lists them here only now and then,
// as a fallback.
func (b *Broker) maintain(ctx context.Context, inc *incarnation, log *slog.Logger) {
	want := map[uint64]bool{}
	for _, id := range b.cfg.Streams {
		want[id] = true
	}
	inc.maintRounds++
	if b.cfg.Takeover && (!b.watchHealthy() || inc.maintRounds%pollEvery == 0) {
		closed, err := b.coords.ListStreams(ctx, "", "closed")
		if err != nil {
			log.Debug("list closed streams", "err", err)
		}
		for _, s := range closed {
			want[s.GetStreamId()] = true
		}
	}
	for id := range want {
		b.walMu.RLock()
		_, have := inc.streams[id]
		b.walMu.RUnlock()
		if !have && !inc.isFenced(b) {
			b.openStream(ctx, inc, id, log)
		}
	}
}

func (inc *incarnation) isFenced(b *Broker) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return inc.fenced
}

// Stop stops the broker. Graceful: refuse new appends, upload and commit
// what the WAL holds, close the streams, close the WAL, leave gossip.
// Otherwise it stops as if the host had crashed (the WAL keeps its tail).
func (b *Broker) Stop(graceful bool) error {
	b.stopMu.Lock()
	defer b.stopMu.Unlock()
	if b.stopped {
		return nil
	}
	b.stopped = true
	b.mu.Lock()
	b.draining = true
	inc := b.inc
	b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
		<-b.done
	}
	var errs []error
	if inc != nil && !inc.fenced {
		if graceful {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			errs = append(errs, b.drain(ctx, inc))
			cancel()
		} else if err := inc.w.Abandon(); err != nil {
			errs = append(errs, err)
		}
	}
	if b.grpc != nil {
		if graceful {
			stopped := make(chan struct{})
			go func() { b.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(3 * time.Second):
				b.grpc.Stop()
			}
		} else {
			b.grpc.Stop()
		}
	}
	if b.agent != nil {
		errs = append(errs, b.agent.Stop(graceful))
	}
	b.coords.Close()
	b.log.Info("broker stopped", "graceful", graceful)
	return errors.Join(errs...)
}

// drain uploads and commits everything, closes the streams and the WAL.
func (b *Broker) drain(ctx context.Context, inc *incarnation) error {
	log := b.log.With("epoch", inc.epoch)
	for ctx.Err() == nil {
		err := b.uploadOnce(ctx, inc, log)
		if err == nil && b.pendingLen(inc) == 0 {
			break
		}
		if errors.Is(err, ErrFenced) {
			_ = inc.w.Close()
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if n := b.pendingLen(inc); n > 0 {
		log.Error("shutdown with records not uploaded; the WAL keeps them for the next start or a recovery", "records", n)
		_ = inc.w.Close()
		return fmt.Errorf("broker: drain: %d records not uploaded", n)
	}
	if h := b.opts.Hooks.Drained; h != nil {
		h()
	}
	for _, id := range inc.streamIDs() {
		s := inc.streams[id]
		err := b.coords.Do(ctx, 3*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
			_, err := waldenv1.NewCatalogClient(conn).CloseStream(ctx, &waldenv1.CloseStreamRequest{
				BrokerId: b.cfg.BrokerID, BrokerEpoch: inc.epoch, StreamId: id, StreamEpoch: s.epoch})
			return err
		})
		if err != nil {
			log.Warn("close stream failed", "stream_id", id, "err", err)
		} else {
			log.Info("stream closed", "stream_id", id, "end_offset", s.committed.Load())
		}
	}
	return inc.w.Close()
}

func (b *Broker) pendingLen(inc *incarnation) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(inc.pending)
}
