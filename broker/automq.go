package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"walden/authz"
	"walden/automq/controller"
	"walden/automq/metaview"
	"walden/automq/object"
	"walden/automq/protocol"
	"walden/config"
	"walden/mtls"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
	"walden/wal"
)

// ErrDataMayBeLost is the AutoMQ-mode broker's refusal to start when its own
// WAL's records of a stream do not start at the controller's end offset
// (AutoMQ's "WAL data may lost"): an operator must look before anything is
// uploaded or closed.
var ErrDataMayBeLost = errors.New("broker: the WAL's records do not start at the controller's end offset: data may be lost")

// ErrOtherNode means the WAL file belongs to another AutoMQ node.
var ErrOtherNode = errors.New("broker: the WAL belongs to another AutoMQ node")

// AutomqBroker is the reference broker in mode automq: it behaves towards
// its WAL, AutoMQ's controller and S3 as an AutoMQ 1.x broker does, and
// never asks walden for a lease. Its node epoch is its start time in
// milliseconds. Create it with NewAutomq, then Start (or Run).
//
// The startup follows AutoMQ's S3Storage: GetOpeningStreams without
// failover (it registers the new epoch and clears a failover flag), upload
// and commit what its own WAL holds beyond the end offsets of the streams
// the node still holds, reset the WAL, close those streams; then it opens
// its streams. An append is acknowledged once the WAL holding it is durable,
// whatever else happens: a fenced node keeps acknowledging until its WAL is
// full, as AutoMQ 1.4 does, which is why the agent beside it runs as a
// watchdog.
type AutomqBroker struct {
	cfg   *config.Broker
	log   *slog.Logger
	opts  Options
	node  int32
	ctl   *controller.Client
	meta  *metaview.Client
	attrs int32
	s3    *objstore.Client
	objs  *metaview.Reader
	ln    net.Listener
	addr  string
	grpc  *grpc.Server
	creds credentials.TransportCredentials

	// epoch is the node epoch, set by Start.
	epoch int64

	// walMu is held shared by appends (from the WAL write to the pending
	// list) and exclusively by the upload's snapshot and by changes of
	// streams, so that a snapshot sees every record the WAL made durable
	// before it.
	walMu   sync.RWMutex
	streams map[uint64]*ownedStream // the streams this broker leads; guarded by walMu

	mu           sync.Mutex
	w            *wal.Writer // nil until the startup recovery is done
	ready        bool
	draining     bool
	pending      []pendingRecord
	pendingBytes int64
	upload       *automqUpload
	uploads      uint64
	lastErr      string
	fenced       bool // the controller refused a commit with NODE_FENCED or NODE_EPOCH_EXPIRED

	kick   chan struct{}
	fatal  chan error
	cancel context.CancelFunc
	done   chan struct{}
	stopMu sync.Mutex
	stop   bool
}

// NewAutomq checks cfg (mode automq) and builds the broker without starting
// anything.
func NewAutomq(cfg *config.Broker, opts Options) (*AutomqBroker, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if !cfg.IsAutomq() {
		return nil, fmt.Errorf("%w: mode is %q, not automq", ErrInvalidConfig, cfg.Mode)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.S3.Logger == nil {
		opts.S3.Logger = opts.Logger
	}
	tlsCfg, err := mtls.Load(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := mtls.CheckIdentity(cfg.TLS, authz.Identity{Role: authz.RoleBroker, BrokerID: cfg.BrokerID}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	fc := cfg.FailoverConfig()
	cc, err := fc.ControllerClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: automq.%w", ErrInvalidConfig, err)
	}
	log := opts.Logger.With("broker_id", cfg.BrokerID, "node_id", cfg.Automq.NodeID)
	cc.Logger = log
	cc.ClientID = "walden-broker-" + cfg.BrokerID
	ctl, err := controller.New(cc)
	if err != nil {
		return nil, fmt.Errorf("%w: automq.controller: %w", ErrInvalidConfig, err)
	}
	attrs, err := object.Attributes{Bucket: cfg.Automq.BucketIndex}.Encode()
	if err != nil {
		return nil, fmt.Errorf("%w: automq.bucket_index: %w", ErrInvalidConfig, err)
	}
	return &AutomqBroker{
		cfg:     cfg,
		log:     log,
		opts:    opts,
		node:    cfg.Automq.NodeID,
		ctl:     ctl,
		meta:    metaview.NewClient(cfg.Automq.MetadataURL, nil),
		attrs:   attrs,
		creds:   mtls.Creds(tlsCfg.Server),
		streams: map[uint64]*ownedStream{},
		kick:    make(chan struct{}, 1),
		fatal:   make(chan error, 1),
		done:    make(chan struct{}),
	}, nil
}

// Addr is the bound address of the data API ("" before Start).
func (b *AutomqBroker) Addr() string { return b.addr }

// NodeEpoch is the node epoch this run registers (0 before Start).
func (b *AutomqBroker) NodeEpoch() int64 { return b.epoch }

// Start checks the WAL, connects to S3, binds the data API and serves; the
// registration at the controller, the recovery of the broker's own WAL and
// the opening of its streams continue in the background (appends answer
// NOT_READY until then).
func (b *AutomqBroker) Start(ctx context.Context) error {
	epoch := time.Now().UnixMilli()
	if h, _, err := wal.ReadHeader(b.cfg.WAL.Path); err == nil {
		if int64(h.NodeID) != int64(b.node) {
			return fmt.Errorf("%w: wal.path %s: %w: node %d, not automq.node_id %d", ErrStart, b.cfg.WAL.Path, ErrOtherNode, h.NodeID, b.node)
		}
		if h.NodeEpoch < math.MaxInt64 {
			// A new epoch is above the last one, whatever the clock says.
			epoch = max(epoch, int64(h.NodeEpoch)+1)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: wal.path: %w", ErrStart, err)
	}
	b.epoch = epoch
	b.log = b.log.With("node_epoch", epoch)
	s3, err := objstore.New(ctx, b.cfg.S3, b.opts.S3)
	if err != nil {
		return fmt.Errorf("%w: s3: %w", ErrStart, err)
	}
	b.s3 = s3
	b.objs = metaview.NewReader(s3)
	ln, err := net.Listen("tcp", b.cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: listen %s: %w", ErrStart, b.cfg.Listen, err)
	}
	b.ln = ln
	b.addr = ln.Addr().String()
	b.grpc = grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(b.creds)}, b.opts.ServerOptions...)...)
	waldenv1.RegisterBrokerAPIServer(b.grpc, &automqAPI{b: b})
	go func() {
		if err := b.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			b.log.Error("broker API stopped", "err", err)
		}
	}()
	rctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() {
		defer close(b.done)
		b.run(rctx)
	}()
	b.log.Info("broker started in mode automq", "listen", b.addr, "wal", b.cfg.WAL.Path, "streams", b.cfg.Streams,
		"controller", b.cfg.Automq.Controller.Voters, "metadata", b.cfg.Automq.MetadataURL)
	return nil
}

// Run starts the broker and blocks until ctx ends (then it stops
// gracefully) or the broker cannot go on (its startup found data that may
// be lost: the error says what).
func (b *AutomqBroker) Run(ctx context.Context) error {
	if err := b.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return b.Stop(true)
	case err := <-b.fatal:
		_ = b.Stop(false)
		return err
	}
}

// Upload starts an upload of what the WAL holds now, as the upload timer
// does when it fires (SIGUSR1 of walden broker in mode automq: a harness
// reads every record from S3 once the brokers uploaded).
func (b *AutomqBroker) Upload() { b.kickUpload() }

// Ready reports whether the startup is done (appends to the streams the
// broker leads are accepted).
func (b *AutomqBroker) Ready() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready && !b.draining
}

// Status is what BrokerStatus answers.
func (b *AutomqBroker) Status() *waldenv1.BrokerStatusResponse {
	resp, _ := (&automqAPI{b: b}).BrokerStatus(context.Background(), nil)
	return resp
}

// run registers, recovers the broker's own WAL, opens its streams, watches
// the nodes it takes over from, and uploads until ctx ends.
func (b *AutomqBroker) run(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for {
		err := b.recoverOwnWAL(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrDataMayBeLost) || errors.Is(err, protocol.ErrNodeEpochExpired) || errors.Is(err, ErrOtherNode) {
			b.log.Error("the broker cannot start", "err", err)
			b.fatal <- err
			return
		}
		b.setErr(err)
		b.log.Warn("startup recovery failed; retrying", "err", err, "backoff", backoff)
		if !sleepFor(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	b.mu.Lock()
	b.ready = true
	b.mu.Unlock()

	var wg sync.WaitGroup
	for _, id := range b.cfg.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.lead(ctx, id, leadConfigured, -1)
		}()
	}
	for _, t := range b.cfg.Automq.Takeover {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.watchNode(ctx, t)
		}()
	}
	defer wg.Wait()

	upload := time.NewTicker(b.cfg.UploadInterval)
	defer upload.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-upload.C:
		case <-b.kick:
		}
		_ = b.uploadOnce(ctx)
	}
}

func (b *AutomqBroker) setErr(err error) {
	b.mu.Lock()
	b.lastErr = err.Error()
	b.mu.Unlock()
}

func sleepFor(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// recoverOwnWAL is AutoMQ's S3Storage startup: GetOpeningStreams without
// failover under the new epoch (the node's streams still opened, with
// their end offsets; it clears a failover flag), the WAL's records of those
// streams from each one's end offset, contiguous, uploaded and committed;
// then the WAL is reset (reopened under the new epoch: every old record is
// past) and those streams closed. After a failover walden has committed
// everything and closed the streams: there is nothing to upload or close.
func (b *AutomqBroker) recoverOwnWAL(ctx context.Context) error {
	opening, err := b.ctl.GetOpeningStreams(ctx, b.node, b.epoch, false)
	if err != nil {
		return fmt.Errorf("broker: register node %d epoch %d: %w", b.node, b.epoch, err)
	}
	var records []wal.Record
	if _, err := os.Stat(b.cfg.WAL.Path); err == nil {
		rec, err := wal.RecoverFile(b.cfg.WAL.Path)
		if err != nil {
			return fmt.Errorf("broker: read the WAL: %w", err)
		}
		if int64(rec.Header.NodeID) != int64(b.node) {
			return fmt.Errorf("%w: node %d, not %d", ErrOtherNode, rec.Header.NodeID, b.node)
		}
		records = rec.Records
	}
	take, err := continuousRecords(records, opening)
	if err != nil {
		return err
	}
	if len(take) > 0 {
		up, err := b.newUpload(take)
		if err != nil {
			return err
		}
		for {
			err := b.commitUpload(ctx, up)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return err
			}
			b.log.Warn("uploading the WAL's records at startup failed; retrying", "err", err)
			if !sleepFor(ctx, 500*time.Millisecond) {
				return ctx.Err()
			}
		}
		b.log.Info("the WAL's records of streams this node still held were committed", "records", len(take),
			"objects", up.objectIDs(), "streams", up.streamIDs())
	}
	w, err := b.openWAL()
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.w = w
	b.mu.Unlock()
	if len(opening) > 0 {
		cs := make([]controller.CloseStream, len(opening))
		for i, s := range opening {
			cs[i] = controller.CloseStream{StreamID: s.StreamID, StreamEpoch: s.Epoch}
		}
		for {
			_, err := b.ctl.CloseStreams(ctx, b.node, b.epoch, cs)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return err
			}
			b.log.Warn("closing the streams this node still held failed; retrying", "err", err)
			if !sleepFor(ctx, 500*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	b.log.Info("startup recovery done", "opening_streams", len(opening), "wal_records", len(records), "uploaded_records", len(take))
	return nil
}

// continuousRecords is AutoMQ's recoverContinuousRecords: the records of
// the opening streams at or beyond each one's end offset, each stream's
// kept while contiguous; a stream whose first kept record does not start at
// its end offset is ErrDataMayBeLost.
func continuousRecords(records []wal.Record, opening []controller.OpeningStream) ([]pendingRecord, error) {
	ends := map[uint64]uint64{}
	for _, s := range opening {
		ends[uint64(s.StreamID)] = uint64(max(s.EndOffset, 0))
	}
	next := map[uint64]uint64{}
	first := map[uint64]uint64{}
	var out []pendingRecord
	for _, r := range records {
		bt := r.Batch
		end, ok := ends[bt.StreamID]
		if !ok || bt.BaseOffset < end {
			continue // closed safely, or committed
		}
		if exp, seen := next[bt.StreamID]; seen && exp != bt.BaseOffset {
			continue // AutoMQ drops a record that does not follow on
		}
		if _, seen := first[bt.StreamID]; !seen {
			first[bt.StreamID] = bt.BaseOffset
		}
		next[bt.StreamID] = bt.EndOffset()
		out = append(out, pendingRecord{walOffset: r.Offset, batch: bt})
	}
	for id, start := range first {
		if start != ends[id] {
			return nil, fmt.Errorf("%w: stream %d ends at %d at the controller, its first record in the WAL starts at %d",
				ErrDataMayBeLost, id, ends[id], start)
		}
	}
	return out, nil
}

// openWAL opens the WAL for appending under the node epoch, creating it
// when missing; reopening discards the old records (AutoMQ's reset).
func (b *AutomqBroker) openWAL() (*wal.Writer, error) {
	wopts := wal.WriterOptions{Logger: b.log}
	if _, err := os.Stat(b.cfg.WAL.Path); err == nil {
		w, err := wal.OpenWriter(b.cfg.WAL.Path, wal.OpenOptions{NodeEpoch: uint64(b.epoch), WriterOptions: wopts})
		if err != nil {
			return nil, fmt.Errorf("broker: open wal: %w", err)
		}
		return w, nil
	}
	w, err := wal.Create(b.cfg.WAL.Path, wal.CreateOptions{Capacity: b.cfg.WAL.Capacity, NodeID: uint32(b.node),
		NodeEpoch: uint64(b.epoch), WriterOptions: wopts})
	if err != nil {
		return nil, fmt.Errorf("broker: create wal: %w", err)
	}
	return w, nil
}

func (b *AutomqBroker) kickUpload() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// Stop stops the broker. Graceful: refuse new appends, upload and commit
// what the WAL holds, close the streams (as AutoMQ's shutdown does), close
// the WAL. Otherwise it stops as if the host had crashed (the WAL keeps its
// tail for the failover or the next start).
func (b *AutomqBroker) Stop(graceful bool) error {
	b.stopMu.Lock()
	defer b.stopMu.Unlock()
	if b.stop {
		return nil
	}
	b.stop = true
	b.mu.Lock()
	b.draining = true
	b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
		<-b.done
	}
	var errs []error
	b.mu.Lock()
	w := b.w
	b.mu.Unlock()
	if w != nil {
		if graceful {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			errs = append(errs, b.drain(ctx, w))
			cancel()
		} else if err := w.Abandon(); err != nil {
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
	b.ctl.Close()
	b.log.Info("broker stopped", "graceful", graceful)
	return errors.Join(errs...)
}

// drain uploads and commits everything, closes the streams and the WAL.
func (b *AutomqBroker) drain(ctx context.Context, w *wal.Writer) error {
	for ctx.Err() == nil {
		err := b.uploadOnce(ctx)
		if err == nil && b.pendingLen() == 0 {
			break
		}
		if !sleepFor(ctx, 100*time.Millisecond) {
			break
		}
	}
	if n := b.pendingLen(); n > 0 {
		b.log.Error("shutdown with records not uploaded; the WAL keeps them for the next start or a failover", "records", n)
		_ = w.Close()
		return fmt.Errorf("broker: drain: %d records not uploaded", n)
	}
	b.walMu.RLock()
	var cs []controller.CloseStream
	for _, s := range b.streams {
		cs = append(cs, controller.CloseStream{StreamID: int64(s.id), StreamEpoch: int64(s.epoch)})
	}
	b.walMu.RUnlock()
	if len(cs) > 0 {
		if _, err := b.ctl.CloseStreams(ctx, b.node, b.epoch, cs); err != nil {
			b.log.Warn("close streams failed", "err", err)
		} else {
			b.log.Info("streams closed", "streams", len(cs))
		}
	}
	return w.Close()
}

func (b *AutomqBroker) pendingLen() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}
