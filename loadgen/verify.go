package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"walden/broker"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// VerifyConfig configures Verify.
type VerifyConfig struct {
	// Coordinators are the coordinators' admin addresses. Required unless
	// Brokers is set.
	Coordinators []string
	// Brokers are the brokers' data API addresses: each stream is read
	// from the broker that says it leads it (brokers in mode automq; see
	// LoadConfig.Brokers).
	Brokers []string
	// Ledger is the file Load wrote. Required.
	Ledger string
	// Wait is how long Verify keeps reading a stream that does not yet
	// reach its last acknowledged offset (uploads and recoveries still
	// running). Default 30s.
	Wait time.Duration
	// BrokerAddrs maps broker ids to API addresses (see LoadConfig).
	BrokerAddrs map[string]string
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

// StreamVerify is one stream's part of a VerifyReport.
type StreamVerify struct {
	Stream     uint64 `json:"stream"`
	Acked      int64  `json:"acked"`
	Present    int64  `json:"present"`
	Lost       int64  `json:"lost"`
	Gaps       int64  `json:"gaps"`
	Duplicates int64  `json:"duplicates"`
	// ReadEnd is one past the last offset read back.
	ReadEnd uint64 `json:"read_end"`
	// LostOffsets lists up to 20 offsets of lost records.
	LostOffsets []uint64 `json:"lost_offsets"`
	// Unbacked lists the committed ranges the read met that no object in
	// the object store backs (OBJECT_MISSING): their records cannot be
	// read.
	Unbacked []UnbackedRange `json:"unbacked"`
}

// UnbackedRange is a committed range of a stream that no object backs:
// the object the catalog names is not in the object store (ObjectID
// empty: the catalog's objects leave a hole there).
type UnbackedRange struct {
	Start    uint64 `json:"start_offset"`
	End      uint64 `json:"end_offset"`
	ObjectID string `json:"object_id"`
	Key      string `json:"key"`
	// Message says it for people.
	Message string `json:"message"`
}

// VerifyReport is the result of Verify. Lost counts acknowledged records
// missing at their acknowledged offset (absent, or another record there);
// Gaps counts offsets missing inside the data read back; Duplicates counts
// extra copies of a record id at other offsets, from the stream's first
// acknowledged offset in the ledger on (record ids restart with every load
// run, so records of earlier runs on the same streams are not duplicates).
type VerifyReport struct {
	Acked      int64 `json:"acked"`
	Present    int64 `json:"present"`
	Lost       int64 `json:"lost"`
	Gaps       int64 `json:"gaps"`
	Duplicates int64 `json:"duplicates"`
	// Unbacked counts the committed ranges no object backs (each stream's
	// are listed in its StreamVerify).
	Unbacked int64          `json:"unbacked"`
	Streams  []StreamVerify `json:"streams"`
}

// OK reports whether nothing acknowledged was lost, nothing has gaps, no
// record is stored twice (Load's producers are idempotent: a retried
// append is stored once) and every committed range read is in an object.
func (r *VerifyReport) OK() bool {
	return r.Lost == 0 && r.Gaps == 0 && r.Duplicates == 0 && r.Unbacked == 0
}

// ReadLedger reads a ledger file: stream → offset → record id. A line that
// is not a ledger entry is an error naming the line.
func ReadLedger(path string) (map[uint64]map[uint64]string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("loadgen: ledger: %w", err)
	}
	defer f.Close()
	out := map[uint64]map[uint64]string{}
	var n int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e LedgerEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.ID == "" {
			return nil, 0, fmt.Errorf("loadgen: ledger %s:%d: not a ledger entry: %q", path, line, sc.Text())
		}
		m := out[e.Stream]
		if m == nil {
			m = map[uint64]string{}
			out[e.Stream] = m
		}
		if prev, dup := m[e.Offset]; dup && prev != e.ID {
			return nil, 0, fmt.Errorf("loadgen: ledger %s:%d: stream %d offset %d acknowledged twice (%s and %s)", path, line, e.Stream, e.Offset, prev, e.ID)
		}
		if _, dup := m[e.Offset]; !dup {
			n++
		}
		m[e.Offset] = e.ID
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("loadgen: ledger %s: %w", path, err)
	}
	return out, n, nil
}

// Verify reads every stream of the ledger back through the brokers and
// checks each acknowledged record.
func Verify(ctx context.Context, cfg VerifyConfig) (*VerifyReport, error) {
	if len(cfg.Coordinators) == 0 && len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: --coordinators: at least one address", ErrInvalid)
	}
	if cfg.Ledger == "" {
		return nil, fmt.Errorf("%w: --ledger: required", ErrInvalid)
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.DialOptions) == 0 {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	led, _, err := ReadLedger(cfg.Ledger)
	if err != nil {
		return nil, err
	}
	var coords *broker.Coordinators
	if len(cfg.Brokers) == 0 {
		coords = broker.NewCoordinators(cfg.Coordinators, cfg.DialOptions...)
		defer coords.Close()
	}
	if len(cfg.BrokerDialOptions) == 0 {
		cfg.BrokerDialOptions = cfg.DialOptions
	}
	res := newResolver(coords, cfg.BrokerAddrs, cfg.BrokerDialOptions)
	res.brokers = cfg.Brokers
	defer res.close()

	rep := &VerifyReport{Streams: []StreamVerify{}}
	ids := make([]uint64, 0, len(led))
	for id := range led {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	deadline := time.Now().Add(cfg.Wait)
	for _, id := range ids {
		sv, err := verifyStream(ctx, res, id, led[id], deadline, cfg.Logger)
		if err != nil {
			return nil, err
		}
		rep.Streams = append(rep.Streams, sv)
		rep.Acked += sv.Acked
		rep.Present += sv.Present
		rep.Lost += sv.Lost
		rep.Gaps += sv.Gaps
		rep.Duplicates += sv.Duplicates
		rep.Unbacked += int64(len(sv.Unbacked))
	}
	return rep, nil
}

// verifyStream reads stream from offset 0 until it reaches the ledger's
// last offset (or the deadline passes), then compares.
func verifyStream(ctx context.Context, res *resolver, stream uint64, acked map[uint64]string, deadline time.Time, log *slog.Logger) (StreamVerify, error) {
	sv := StreamVerify{Stream: stream, Acked: int64(len(acked)), LostOffsets: []uint64{}, Unbacked: []UnbackedRange{}}
	var need uint64 // one past the last acknowledged offset
	first := uint64(math.MaxUint64)
	for off := range acked {
		need = max(need, off+1)
		first = min(first, off)
	}
	got := map[uint64]string{}
	seen := map[string]int{}
	next := uint64(0)
	for {
		recs, err := readSome(ctx, res, stream, next)
		if u, ok := unbackedOf(err); ok && u.End > next {
			// Nothing can read these offsets: report them and read on
			// after them.
			log.Warn("committed range in no object", "stream_id", stream, "start_offset", u.Start, "end_offset", u.End, "object_id", u.ObjectID)
			sv.Unbacked = append(sv.Unbacked, u)
			next = u.End
			continue
		}
		if err != nil {
			log.Debug("read failed", "stream_id", stream, "from", next, "err", err)
		}
		for _, r := range recs {
			if r.GetOffset() < next {
				continue
			}
			sv.Gaps += int64(r.GetOffset() - next)
			id := PayloadID(r.GetPayload())
			got[r.GetOffset()] = id
			// Record ids restart at 0 with every load run: only the
			// records from the ledger's first acknowledged offset on
			// belong to this run, the ones below to earlier runs.
			if r.GetOffset() >= first {
				seen[id]++
			}
			next = r.GetOffset() + 1
		}
		if len(recs) > 0 {
			continue
		}
		if next >= need || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	sv.ReadEnd = next
	for off, id := range acked {
		if got[off] == id {
			sv.Present++
		} else {
			sv.Lost++
			if len(sv.LostOffsets) < 20 {
				sv.LostOffsets = append(sv.LostOffsets, off)
			}
		}
	}
	slices.Sort(sv.LostOffsets)
	for _, n := range seen {
		if n > 1 {
			sv.Duplicates += int64(n - 1)
		}
	}
	return sv, nil
}

// unbackedOf reads the committed range of an OBJECT_MISSING refusal.
func unbackedOf(err error) (UnbackedRange, bool) {
	if rpcerr.Reason(err) != refusal.ObjectMissing {
		return UnbackedRange{}, false
	}
	md := rpcerr.Metadata(err)
	start, err1 := strconv.ParseUint(md[broker.MetaStartOffset], 10, 64)
	end, err2 := strconv.ParseUint(md[broker.MetaEndOffset], 10, 64)
	if err1 != nil || err2 != nil || end <= start {
		return UnbackedRange{}, false
	}
	return UnbackedRange{Start: start, End: end, ObjectID: md[broker.MetaObjectID], Key: md[broker.MetaKey],
		Message: status.Convert(err).Message()}, true
}

// readSome reads from one broker: the owner first (it also serves its tail
// not yet committed), else any registered broker (committed data).
func readSome(ctx context.Context, res *resolver, stream, from uint64) ([]*waldenv1.ReadRecord, error) {
	read := func(addr string) ([]*waldenv1.ReadRecord, error) {
		cl, err := res.client(addr)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := cl.Read(rctx, &waldenv1.ReadRequest{StreamId: stream, FromOffset: from, MaxRecords: 1000})
		if err != nil {
			return nil, err
		}
		return r.GetRecords(), nil
	}
	owner, err := res.owner(ctx, stream)
	if err == nil {
		recs, rerr := read(owner)
		if rerr == nil || rpcerr.Reason(rerr) == refusal.ObjectMissing {
			return recs, rerr // another broker reads the same object store
		}
		err = rerr
	}
	last := err
	for _, a := range res.anyBrokers(ctx) {
		if a == owner {
			continue
		}
		recs, err := read(a)
		if err == nil || rpcerr.Reason(err) == refusal.ObjectMissing {
			return recs, err
		}
		last = err
	}
	return nil, fmt.Errorf("loadgen: no broker answered a read of stream %d: %w", stream, last)
}
