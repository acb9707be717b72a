package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"walden/wal"
)

func init() { rootCmd.AddCommand(newWALCmd()) }

// newWALCmd builds `walden wal` with its inspect and gen subcommands.
func newWALCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wal",
		Short: "Inspect and generate AutoMQ block WAL files",
	}
	cmd.AddCommand(newWALInspectCmd(), newWALGenCmd())
	return cmd
}

// walInspectJSON is the JSON form of `walden wal inspect -o json`.
type walInspectJSON struct {
	File         string           `json:"file"`
	Header       walHeaderJSON    `json:"header"`
	Records      int              `json:"records"`
	SkippedBytes int64            `json:"skipped_bytes"`
	Skipped      map[string]int64 `json:"skipped"`
	EndOffset    int64            `json:"end_offset"`
	EndReason    string           `json:"end_reason"`
	Streams      []walStreamJSON  `json:"streams"`
}

type walHeaderJSON struct {
	Magic                  string `json:"magic"`
	Version                int    `json:"version"`
	Capacity               uint64 `json:"capacity"`
	TrimOffset             int64  `json:"trim_offset"`
	LastWriteTimestamp     uint64 `json:"last_write_timestamp"`
	SlidingWindowMaxLength uint64 `json:"sliding_window_max_length"`
	ShutdownType           string `json:"shutdown_type"`
	NodeID                 uint32 `json:"node_id"`
	NodeEpoch              uint64 `json:"node_epoch"`
	Slot                   int    `json:"slot"`
}

type walStreamJSON struct {
	StreamID     uint64 `json:"stream_id"`
	FirstOffset  uint64 `json:"first_offset"`
	EndOffset    uint64 `json:"end_offset"`
	Records      int    `json:"records"`
	PayloadBytes int64  `json:"payload_bytes"`
	Gaps         int    `json:"gaps"`
}

func newWALInspectCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Show a WAL's header, records per stream and skipped bytes (read-only)",
		Long: `inspect opens FILE read-only, picks the current header slot and walks the
records from the trim offset with the recovery rules. It prints the header,
the number of valid records, every stream's offset range ([first_offset,
end_offset), end_offset = base_offset + count of its last batch), and how many
bytes the scan skipped and why. It never writes to FILE.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output: must be table or json, got %q", output)
			}
			report, err := inspectWAL(args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(report)
			}
			return printInspectTable(cmd.OutOrStdout(), report)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// inspectWAL scans path and summarises it per stream.
func inspectWAL(path string) (*walInspectJSON, error) {
	rd, err := wal.Open(path)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	h := rd.Header()
	streams := map[uint64]*walStreamJSON{}
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		b := rec.Batch
		s, ok := streams[b.StreamID]
		if !ok {
			s = &walStreamJSON{StreamID: b.StreamID, FirstOffset: b.BaseOffset, EndOffset: b.BaseOffset}
			streams[b.StreamID] = s
		}
		if b.BaseOffset != s.EndOffset {
			s.Gaps++
		}
		s.EndOffset = b.EndOffset()
		s.Records++
		s.PayloadBytes += int64(len(b.Payload))
	}
	st := rd.Stats()
	report := &walInspectJSON{
		File: path,
		Header: walHeaderJSON{
			Magic:                  fmt.Sprintf("0x%08x", h.Magic),
			Version:                h.Version(),
			Capacity:               h.Capacity,
			TrimOffset:             h.TrimOffset,
			LastWriteTimestamp:     h.LastWriteTimestamp,
			SlidingWindowMaxLength: h.SlidingWindowMaxLength,
			ShutdownType:           h.ShutdownType.String(),
			NodeID:                 h.NodeID,
			NodeEpoch:              h.NodeEpoch,
			Slot:                   rd.Slot(),
		},
		Records:      st.Records,
		SkippedBytes: st.SkippedBytes,
		Skipped:      st.SkippedByReason,
		EndOffset:    st.EndOffset,
		EndReason:    st.EndReason,
		Streams:      []walStreamJSON{},
	}
	for _, s := range streams {
		report.Streams = append(report.Streams, *s)
	}
	sort.Slice(report.Streams, func(i, j int) bool { return report.Streams[i].StreamID < report.Streams[j].StreamID })
	return report, nil
}

func printInspectTable(out io.Writer, r *walInspectJSON) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	h := r.Header
	fmt.Fprintf(tw, "file\t%s\n", r.File)
	fmt.Fprintf(tw, "version\t%d (magic %s)\n", h.Version, h.Magic)
	fmt.Fprintf(tw, "capacity\t%d\n", h.Capacity)
	fmt.Fprintf(tw, "trim_offset\t%d\n", h.TrimOffset)
	fmt.Fprintf(tw, "node_id\t%d\n", h.NodeID)
	fmt.Fprintf(tw, "node_epoch\t%d\n", h.NodeEpoch)
	fmt.Fprintf(tw, "shutdown_type\t%s\n", h.ShutdownType)
	fmt.Fprintf(tw, "header_slot\t%d (last_write_timestamp %d)\n", h.Slot, h.LastWriteTimestamp)
	fmt.Fprintf(tw, "records\t%d\n", r.Records)
	reasons := make([]string, 0, len(r.Skipped))
	for reason, n := range r.Skipped {
		reasons = append(reasons, fmt.Sprintf("%s %d", reason, n))
	}
	sort.Strings(reasons)
	fmt.Fprintf(tw, "skipped_bytes\t%d", r.SkippedBytes)
	if len(reasons) > 0 {
		fmt.Fprintf(tw, " (%s)", strings.Join(reasons, ", "))
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "end_offset\t%d (%s)\n", r.EndOffset, r.EndReason)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tFIRST_OFFSET\tEND_OFFSET\tRECORDS\tPAYLOAD_BYTES\tGAPS")
	for _, s := range r.Streams {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\n", s.StreamID, s.FirstOffset, s.EndOffset, s.Records, s.PayloadBytes, s.Gaps)
	}
	return tw.Flush()
}

type walGenOptions struct {
	records   int
	streams   int
	payload   int
	count     int
	group     int
	capacity  int64
	nodeID    uint32
	nodeEpoch uint64
	trimAt    int
	tornTail  bool
}

func newWALGenCmd() *cobra.Command {
	var o walGenOptions
	cmd := &cobra.Command{
		Use:   "gen FILE",
		Short: "Write a test WAL in AutoMQ 1.4 block WAL format (version 1)",
		Long: `gen creates FILE (it must not exist) and appends --records batches spread
round-robin over --streams streams (ids 1..S), each with --payload bytes and
--count offsets; every stream's offsets are contiguous from 0. --group G
appends G batches per group commit, so they share blocks (1: one batch per
block). --trim-at K
trims the first K records (the trim offset becomes the offset of record K;
trimming is inclusive). --torn-tail then starts one more record and leaves it
half written with no shutdown header, as a crash during that write would:
recovery returns the acknowledged records only.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return genWAL(cmd.Context(), cmd.OutOrStdout(), args[0], o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.records, "records", 1000, "number of record batches to append")
	f.IntVar(&o.streams, "streams", 4, "number of streams (ids 1..S)")
	f.IntVar(&o.payload, "payload", 1024, "payload bytes per batch")
	f.IntVar(&o.count, "count", 1, "offsets per batch (the body's lastOffsetDelta)")
	f.IntVar(&o.group, "group", 1, "batches per group commit (packed into shared blocks)")
	f.Int64Var(&o.capacity, "capacity", 64<<20, "WAL capacity in bytes, header slots included (multiple of 4096)")
	f.Uint32Var(&o.nodeID, "node-id", 1, "node id written in the header")
	f.Uint64Var(&o.nodeEpoch, "node-epoch", 1, "node epoch written in the header")
	f.IntVar(&o.trimAt, "trim-at", 0, "trim the first K records (0: no trim)")
	f.BoolVar(&o.tornTail, "torn-tail", false, "leave a half-written record at the tail and no shutdown header")
	return cmd
}

func genWAL(ctx context.Context, out io.Writer, path string, o walGenOptions) error {
	switch {
	case o.records < 0:
		return fmt.Errorf("--records: must not be negative, got %d", o.records)
	case o.streams < 1:
		return fmt.Errorf("--streams: must be at least 1, got %d", o.streams)
	case o.payload < 0:
		return fmt.Errorf("--payload: must not be negative, got %d", o.payload)
	case o.group < 1:
		return fmt.Errorf("--group: must be at least 1, got %d", o.group)
	case o.count < 1:
		return fmt.Errorf("--count: must be at least 1, got %d", o.count)
	case o.trimAt < 0 || o.trimAt > o.records:
		return fmt.Errorf("--trim-at: must be between 0 and --records (%d), got %d", o.records, o.trimAt)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	w, err := wal.Create(path, wal.CreateOptions{Capacity: o.capacity, NodeID: o.nodeID, NodeEpoch: o.nodeEpoch})
	if err != nil {
		return err
	}
	next := make([]uint64, o.streams)
	batch := func(i int) wal.Batch {
		s := i % o.streams
		p := make([]byte, o.payload)
		for j := range p {
			p[j] = byte(i + j)
		}
		b := wal.Batch{StreamID: uint64(s + 1), Epoch: 1, BaseOffset: next[s], Count: uint32(o.count), Payload: p}
		next[s] += uint64(o.count)
		return b
	}
	offsets := make([]int64, 0, o.records)
	for i := 0; i < o.records; i += o.group {
		group := make([]wal.Batch, 0, o.group)
		for j := i; j < min(i+o.group, o.records); j++ {
			group = append(group, batch(j))
		}
		offs, err := w.AppendAll(ctx, group)
		for k, off := range offs {
			if err != nil && off < 0 {
				w.Abandon()
				return fmt.Errorf("record %d: %w", i+k, err)
			}
		}
		if err != nil {
			w.Abandon()
			return err
		}
		offsets = append(offsets, offs...)
	}
	if o.trimAt > 0 {
		if err := w.Trim(offsets[o.trimAt-1]); err != nil {
			w.Abandon()
			return err
		}
	}
	trim := w.Header().TrimOffset
	if !o.tornTail {
		if err := w.Close(); err != nil {
			return err
		}
		fmt.Fprintf(out, "wrote %d records over %d streams to %s (capacity %d, trim offset %d)\n",
			o.records, o.streams, path, o.capacity, trim)
		return nil
	}
	b := batch(o.records)
	off, err := w.Append(ctx, b)
	if err != nil {
		w.Abandon()
		return fmt.Errorf("torn record: %w", err)
	}
	if err := w.Abandon(); err != nil {
		return err
	}
	if err := tearRecord(path, off, wal.RecordHeaderSize+wal.BodyHeaderSize+len(b.Payload), o.capacity); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %d records over %d streams to %s (capacity %d, trim offset %d), then a torn record at offset %d and no shutdown header\n",
		o.records, o.streams, path, o.capacity, trim, off)
	return nil
}

// tearRecord zeroes the second half of the record of size bytes at logical
// offset off, as if the write had stopped in the middle of it.
func tearRecord(path string, off int64, size int, capacity int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("tear tail: %w", err)
	}
	half := size / 2
	_, err = f.WriteAt(make([]byte, size-half), wal.PhysicalOffset(off, capacity)+int64(half))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tear tail of %s: %w", path, err)
	}
	return nil
}
