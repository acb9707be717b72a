package loadgen

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"walden/broker"
	"walden/coordclient"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// ErrInvalid wraps an invalid Load or Verify configuration; the message
// names the flag.
var ErrInvalid = errors.New("loadgen: invalid configuration")

// ErrNoStreams means the catalog has no stream to load.
var ErrNoStreams = errors.New("loadgen: no streams in the catalog")

// LedgerEntry is one line of the ledger: an acknowledged record.
type LedgerEntry struct {
	Stream uint64 `json:"stream"`
	Offset uint64 `json:"offset"`
	ID     string `json:"id"`
}

// RecordID returns the id of record seq of stream: "stream/seq".
func RecordID(stream, seq uint64) string {
	return strconv.FormatUint(stream, 10) + "/" + strconv.FormatUint(seq, 10)
}

// Payload returns the payload of a record: its id, '|', then filler up to
// size bytes (never shorter than the id and '|').
func Payload(id string, size int) []byte {
	p := make([]byte, max(size, len(id)+1))
	copy(p, id)
	p[len(id)] = '|'
	for i := len(id) + 1; i < len(p); i++ {
		p[i] = 'x'
	}
	return p
}

// PayloadID returns the record id a payload starts with ("" when none).
func PayloadID(p []byte) string {
	i := slices.Index(p, '|')
	if i <= 0 {
		return ""
	}
	return string(p[:i])
}

// LoadConfig configures Load.
type LoadConfig struct {
	// Coordinators are the coordinators' admin addresses: a stream's owner
	// is found through their catalog. Required unless Brokers is set.
	Coordinators []string
	// Brokers are the brokers' data API addresses: a stream's leader is
	// found by asking each broker which streams it leads (BrokerStatus),
	// as a Kafka client reads metadata from the brokers. For brokers in
	// mode automq, whose streams no catalog of walden's knows; Streams is
	// then required.
	Brokers []string
	// Streams to load; empty means every stream in the catalog.
	Streams []uint64
	// Rate is the records per second over all streams. Required (> 0).
	Rate float64
	// Duration bounds the run. Required (> 0).
	Duration time.Duration
	// MaxRecords bounds the records generated in all; 0 means
	// Rate × Duration.
	MaxRecords int64
	// PayloadBytes is the size of each record. Default 64.
	PayloadBytes int
	// Ledger is the file that receives one line per acknowledged record.
	// Required; created or truncated.
	Ledger string
	// BrokerAddrs maps broker ids to API addresses, overriding the
	// broker_addr they registered. Optional.
	BrokerAddrs map[string]string
	// MaxBatch caps the records sent in one Append. Default 500.
	MaxBatch int
	// AppendTimeout bounds one Append (a broker that hangs, e.g. stopped,
	// is given up after it and the owner resolved again). Default 2s.
	AppendTimeout time.Duration
	// PlainAppends sends appends without a producer id: a retry of an
	// append that was stored but not acknowledged stores its records
	// twice. For comparison only; by default every stream's producer is
	// idempotent.
	PlainAppends bool
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
	// DialOptions for the coordinators (and the brokers, unless
	// BrokerDialOptions is set); default plain gRPC.
	DialOptions []grpc.DialOption
	// BrokerDialOptions for the brokers' data API; default DialOptions.
	// With mutual TLS a client of the coordinators requires the
	// coordinator role of the server's certificate, a client of the
	// brokers the broker role (mtls.BrokerClientCreds).
	BrokerDialOptions []grpc.DialOption
}

// StreamLoad is one stream's part of a LoadReport.
type StreamLoad struct {
	Stream    uint64 `json:"stream"`
	Generated int64  `json:"generated"`
	Acked     int64  `json:"acked"`
	Errors    int64  `json:"errors"`
	// Pending counts records generated but never acknowledged.
	Pending int64 `json:"pending"`
	// MaxUnavailableMs is the longest time without a successful append
	// while records waited.
	MaxUnavailableMs int64 `json:"max_unavailable_ms"`
	// Owners lists the broker addresses that acknowledged, in order of
	// first use.
	Owners []string `json:"owners"`
	// ProducerID is the stream's idempotent producer id (the last one
	// after resets; 0 with PlainAppends).
	ProducerID uint64 `json:"producer_id"`
	// DuplicateAcks counts records of retried appends that the broker
	// answered as already stored (acknowledged once, stored once).
	DuplicateAcks int64 `json:"duplicate_acks"`
	// ProducerResets counts the times the stream forgot the producer
	// (UNKNOWN_PRODUCER, OUT_OF_ORDER_SEQUENCE) and the producer started
	// again with a new id; the batch in flight then may be stored twice.
	ProducerResets int64 `json:"producer_resets"`
}

// LoadReport is the result of Load.
type LoadReport struct {
	Generated           int64        `json:"generated"`
	Acked               int64        `json:"acked"`
	Errors              int64        `json:"errors"`
	Pending             int64        `json:"pending"`
	DurationMs          int64        `json:"duration_ms"`
	MaxUnavailableMs    int64        `json:"max_unavailable_ms"`
	MedianUnavailableMs int64        `json:"median_unavailable_ms"`
	DuplicateAcks       int64        `json:"duplicate_acks"`
	ProducerResets      int64        `json:"producer_resets"`
	Streams             []StreamLoad `json:"streams"`
}

func (c *LoadConfig) validate() error {
	switch {
	case len(c.Coordinators) == 0 && len(c.Brokers) == 0:
		return fmt.Errorf("%w: --coordinators: at least one address (or --brokers)", ErrInvalid)
	case len(c.Coordinators) > 0 && len(c.Brokers) > 0:
		return fmt.Errorf("%w: --brokers: give the coordinators or the brokers, not both", ErrInvalid)
	case len(c.Brokers) > 0 && len(c.Streams) == 0:
		return fmt.Errorf("%w: --streams: required with --brokers (no catalog lists the streams)", ErrInvalid)
	case !(c.Rate > 0) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("%w: --rate: must be a positive number of records per second, got %v", ErrInvalid, c.Rate)
	case c.Duration <= 0:
		return fmt.Errorf("%w: --duration: must be positive, got %s", ErrInvalid, c.Duration)
	case c.Ledger == "":
		return fmt.Errorf("%w: --ledger: required", ErrInvalid)
	case c.MaxRecords < 0:
		return fmt.Errorf("%w: --max-records: must not be negative", ErrInvalid)
	case c.PayloadBytes < 0 || c.PayloadBytes > 1<<20:
		return fmt.Errorf("%w: --payload: must be 0..1048576 bytes, got %d", ErrInvalid, c.PayloadBytes)
	}
	return nil
}

// ledger writes acknowledged records, flushed periodically and fsynced at
// the end.
type ledger struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

func (l *ledger) add(stream, base uint64, ids []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, id := range ids {
		line, _ := json.Marshal(LedgerEntry{Stream: stream, Offset: base + uint64(i), ID: id})
		l.w.Write(line)
		if err := l.w.WriteByte('\n'); err != nil {
			return fmt.Errorf("loadgen: ledger: %w", err)
		}
	}
	return nil
}

func (l *ledger) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("loadgen: ledger: %w", err)
	}
	return nil
}

func (l *ledger) close() error {
	err := l.flush()
	if serr := l.f.Sync(); serr != nil && err == nil {
		err = fmt.Errorf("loadgen: ledger sync: %w", serr)
	}
	if cerr := l.f.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("loadgen: ledger close: %w", cerr)
	}
	return err
}

// Load appends records at cfg.Rate for cfg.Duration (or until ctx ends) and
// returns the report once every stream's producer stopped. Records not yet
// acknowledged at the end are counted as pending, not retried further.
func Load(ctx context.Context, cfg LoadConfig) (*LoadReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.PayloadBytes == 0 {
		cfg.PayloadBytes = 64
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 500
	}
	if cfg.AppendTimeout <= 0 {
		cfg.AppendTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.DialOptions) == 0 {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	var coords *broker.Coordinators
	if len(cfg.Coordinators) > 0 {
		coords = broker.NewCoordinators(cfg.Coordinators, cfg.DialOptions...)
		defer coords.Close()
	}
	streams := slices.Clone(cfg.Streams)
	if len(streams) == 0 {
		all, err := coords.ListStreams(ctx, "", "")
		if err != nil {
			return nil, fmt.Errorf("loadgen: list streams: %w", err)
		}
		for _, s := range all {
			streams = append(streams, s.GetStreamId())
		}
		if len(streams) == 0 {
			return nil, ErrNoStreams
		}
	}
	slices.Sort(streams)
	streams = slices.Compact(streams)

	f, err := os.Create(cfg.Ledger)
	if err != nil {
		return nil, fmt.Errorf("loadgen: ledger: %w", err)
	}
	led := &ledger{f: f, w: bufio.NewWriterSize(f, 64<<10)}
	total := cfg.MaxRecords
	if total == 0 {
		total = int64(math.Ceil(cfg.Rate * cfg.Duration.Seconds()))
	}
	if len(cfg.BrokerDialOptions) == 0 {
		cfg.BrokerDialOptions = cfg.DialOptions
	}
	res := newResolver(coords, cfg.BrokerAddrs, cfg.BrokerDialOptions)
	res.brokers = cfg.Brokers
	defer res.close()

	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()
	flushDone := make(chan struct{})
	go func() {
		defer close(flushDone)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				_ = led.flush()
			}
		}
	}()
	reports := make([]StreamLoad, len(streams))
	var wg sync.WaitGroup
	for i, id := range streams {
		quota := total / int64(len(streams))
		if int64(i) < total%int64(len(streams)) {
			quota++
		}
		p := &producer{stream: id, rate: cfg.Rate / float64(len(streams)), quota: quota, payload: cfg.PayloadBytes,
			maxBatch: cfg.MaxBatch, timeout: cfg.AppendTimeout, res: res, led: led, log: cfg.Logger.With("stream_id", id),
			idempotent: !cfg.PlainAppends}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reports[i] = p.run(runCtx, start)
		}()
	}
	wg.Wait()
	cancel()
	<-flushDone
	rep := &LoadReport{DurationMs: time.Since(start).Milliseconds(), Streams: reports}
	var unav []int64
	for _, s := range reports {
		rep.Generated += s.Generated
		rep.Acked += s.Acked
		rep.Errors += s.Errors
		rep.Pending += s.Pending
		rep.DuplicateAcks += s.DuplicateAcks
		rep.ProducerResets += s.ProducerResets
		rep.MaxUnavailableMs = max(rep.MaxUnavailableMs, s.MaxUnavailableMs)
		unav = append(unav, s.MaxUnavailableMs)
	}
	rep.MedianUnavailableMs = median(unav)
	if err := led.close(); err != nil {
		return rep, err
	}
	return rep, nil
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// producer appends one stream's records. With idempotent set it is the
// stream's idempotent producer: record number N is sequence N − seqBase of
// producer pid, and an append that failed is retried with the same batch
// (same first sequence, same records) until it is acknowledged, so that a
// broker that stored it answers with the stored offsets.
type producer struct {
	stream     uint64
	rate       float64
	quota      int64
	payload    int
	maxBatch   int
	timeout    time.Duration
	res        *resolver
	led        *ledger
	log        *slog.Logger
	idempotent bool

	pid     uint64
	seqBase uint64
}

// newProducerID draws a random non-zero 63-bit producer id.
func newProducerID() uint64 {
	for {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("loadgen: no randomness for a producer id: %v", err)) // crypto/rand does not fail on Linux
		}
		if id := binary.BigEndian.Uint64(b[:]) >> 1; id != 0 {
			return id
		}
	}
}

// producerForgotten reports a refusal saying the stream does not know the
// producer's state (any more).
func producerForgotten(err error) bool {
	r := rpcerr.Reason(err)
	return r == refusal.UnknownProducer || r == refusal.OutOfOrderSequence
}

func (p *producer) run(ctx context.Context, start time.Time) StreamLoad {
	rep := StreamLoad{Stream: p.stream, Owners: []string{}}
	if p.idempotent {
		p.pid = newProducerID()
	}
	var pending []uint64 // record numbers not acknowledged, in order
	var inflight int     // records of the batch sent and not acknowledged (0: none)
	var seq uint64
	var waitingSince time.Time
	var maxUnavail time.Duration
	addr := ""
	backoff := 10 * time.Millisecond
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		now := time.Now()
		// Generate the records due by now.
		due := int64(p.rate * now.Sub(start).Seconds())
		for int64(seq) < min(due, p.quota) {
			pending = append(pending, seq)
			seq++
			if waitingSince.IsZero() {
				waitingSince = now
			}
		}
		if len(pending) == 0 {
			if int64(seq) >= p.quota {
				break loop
			}
			select {
			case <-ctx.Done():
				break loop
			case <-tick.C:
				continue
			}
		}
		if ctx.Err() != nil {
			break loop
		}
		if addr == "" {
			a, err := p.res.owner(ctx, p.stream)
			if err != nil {
				rep.Errors++
				p.log.Debug("no owner", "err", err)
				sleep(ctx, backoff)
				backoff = min(2*backoff, 200*time.Millisecond)
				continue
			}
			addr = a
		}
		// A batch that was sent is resent as it was until acknowledged.
		n := inflight
		if n == 0 {
			n = min(len(pending), p.maxBatch)
		}
		inflight = n
		recs := make([][]byte, n)
		ids := make([]string, n)
		for i := 0; i < n; i++ {
			ids[i] = RecordID(p.stream, pending[i])
			recs[i] = Payload(ids[i], p.payload)
		}
		var resp *waldenv1.AppendResponse
		cl, err := p.res.client(addr)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, p.timeout)
			req := &waldenv1.AppendRequest{StreamId: p.stream, Records: recs}
			if p.pid != 0 {
				req.ProducerId, req.Sequence = p.pid, pending[0]-p.seqBase
			}
			resp, err = cl.Append(actx, req)
			cancel()
		}
		if err != nil && ctx.Err() != nil {
			break loop // the run ended during the append: not an error of the broker
		}
		if err != nil {
			rep.Errors++
			hint := ownerAddrHint(err)
			p.log.Debug("append failed", "addr", addr, "hint", hint, "err", err)
			if p.pid != 0 && producerForgotten(err) {
				// The stream lost this producer's state: go on as a new
				// producer. The batch in flight may have been stored, and
				// may now be stored twice.
				old := p.pid
				p.pid, p.seqBase, inflight = newProducerID(), pending[0], 0
				rep.ProducerResets++
				p.log.Warn("the stream forgot this producer; starting again with a new producer id",
					"old_producer_id", old, "producer_id", p.pid, "err", err)
				continue
			}
			if hint != "" && hint != addr {
				addr = hint
				continue
			}
			addr = ""
			sleep(ctx, backoff)
			backoff = min(2*backoff, 200*time.Millisecond)
			continue
		}
		backoff = 10 * time.Millisecond
		inflight = 0
		if resp.GetDuplicate() {
			rep.DuplicateAcks += int64(n)
			p.log.Debug("retried append was stored already", "addr", addr, "base_offset", resp.GetBaseOffset(), "count", n)
		}
		if err := p.led.add(p.stream, resp.GetBaseOffset(), ids); err != nil {
			p.log.Error("ledger write failed", "err", err)
		}
		if !slices.Contains(rep.Owners, addr) {
			rep.Owners = append(rep.Owners, addr)
		}
		rep.Acked += int64(n)
		pending = pending[n:]
		now = time.Now()
		maxUnavail = max(maxUnavail, now.Sub(waitingSince))
		if len(pending) > 0 {
			waitingSince = now
		} else {
			waitingSince = time.Time{}
		}
	}
	if len(pending) > 0 && !waitingSince.IsZero() {
		maxUnavail = max(maxUnavail, time.Since(waitingSince))
	}
	rep.Generated = int64(seq)
	rep.Pending = int64(len(pending))
	rep.ProducerID = p.pid
	rep.MaxUnavailableMs = maxUnavail.Milliseconds()
	return rep
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// ownerAddrHint reads the owner's address from a NOT_OWNER refusal.
func ownerAddrHint(err error) string {
	if rpcerr.Reason(err) != refusal.NotOwner {
		return ""
	}
	return rpcerr.Metadata(err)[broker.MetaOwnerAddr]
}

// resolver finds stream owners' addresses and keeps one connection per
// broker address: through the coordinators' catalog, or, with brokers set,
// by asking the brokers which streams they lead.
type resolver struct {
	coords    *broker.Coordinators
	brokers   []string
	overrides map[string]string
	conns     *coordclient.Conns

	mu      sync.Mutex
	leaders map[uint64]string
	asked   time.Time
}

func newResolver(c *broker.Coordinators, overrides map[string]string, dial []grpc.DialOption) *resolver {
	return &resolver{coords: c, overrides: overrides, conns: coordclient.NewConns(dial...)}
}

// leadersMaxAge is how long the brokers' answers serve every stream's
// lookups before the brokers are asked again.
const leadersMaxAge = 100 * time.Millisecond

// leader returns the address of the broker that leads stream, asking every
// broker (BrokerStatus, in parallel) when the last answers are older than
// leadersMaxAge.
func (r *resolver) leader(ctx context.Context, stream uint64) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.asked) > leadersMaxAge {
		leaders := map[uint64]string{}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, addr := range r.brokers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl, err := r.client(addr)
				if err != nil {
					return
				}
				sctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				st, err := cl.BrokerStatus(sctx, &waldenv1.BrokerStatusRequest{})
				if err != nil || !st.GetServing() {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, s := range st.GetStreams() {
					leaders[s.GetStreamId()] = addr
				}
			}()
		}
		wg.Wait()
		r.leaders, r.asked = leaders, time.Now()
	}
	if a, ok := r.leaders[stream]; ok {
		return a, nil
	}
	return "", fmt.Errorf("loadgen: no broker of %v leads stream %d", r.brokers, stream)
}

func (r *resolver) brokerAddr(ctx context.Context, id string) (string, error) {
	if a := r.overrides[id]; a != "" {
		return a, nil
	}
	a, err := r.coords.BrokerAddr(ctx, id)
	if err != nil {
		return "", err
	}
	if a == "" {
		return "", fmt.Errorf("loadgen: broker %s registered no broker_addr", id)
	}
	return a, nil
}

// owner returns the API address of the stream's owner.
func (r *resolver) owner(ctx context.Context, stream uint64) (string, error) {
	if r.coords == nil {
		return r.leader(ctx, stream)
	}
	d, err := r.coords.DescribeStream(ctx, stream, math.MaxUint64, 1)
	if err != nil {
		return "", err
	}
	st := d.GetStream()
	if st.GetState() != "opened" || st.GetOwnerBrokerId() == "" {
		return "", fmt.Errorf("loadgen: stream %d is %s: no owner", stream, st.GetState())
	}
	return r.brokerAddr(ctx, st.GetOwnerBrokerId())
}

// anyBrokers returns the API addresses of the registered brokers (the
// configured ones without coordinators).
func (r *resolver) anyBrokers(ctx context.Context) []string {
	if r.coords == nil {
		return slices.Clone(r.brokers)
	}
	var out []string
	bs, _ := r.coords.Brokers(ctx)
	for _, b := range bs {
		if a, err := r.brokerAddr(ctx, b.GetBrokerId()); err == nil && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func (r *resolver) client(addr string) (waldenv1.BrokerAPIClient, error) {
	conn, err := r.conns.Get(addr)
	if err != nil {
		return nil, fmt.Errorf("loadgen: broker %s: %w", addr, err)
	}
	return waldenv1.NewBrokerAPIClient(conn), nil
}

func (r *resolver) close() {
	r.conns.Close()
}
