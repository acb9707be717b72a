package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"walden/loadgen"
)

func init() { rootCmd.AddCommand(newLoadCmd(), newVerifyCmd()) }

// parseList splits a comma-separated flag value, dropping empty items.
func parseList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseStreams(s string) ([]uint64, error) {
	var out []uint64
	for _, p := range parseList(s) {
		id, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--streams: %q is not a stream id", p)
		}
		out = append(out, id)
	}
	return out, nil
}

// parseAddrMap parses "b1=127.0.0.1:9101,b2=..." into a map.
func parseAddrMap(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range parseList(s) {
		id, addr, ok := strings.Cut(p, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--broker-addrs: %q is not broker_id=host:port", p)
		}
		out[id] = addr
	}
	return out, nil
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return fmt.Errorf("--output: must be table or json, got %q", o)
	}
	return nil
}

func newLoadCmd() *cobra.Command {
	var coords, brokers, streams, ledger, output, addrs string
	var rate float64
	var duration, appendTimeout time.Duration
	var payload int
	var maxRecords int64
	var ct clientTLS
	var plain bool
	cmd := &cobra.Command{
		Use:   "load --coordinators A,B,C --ledger FILE [--streams 1,2,3] [--rate R] [--duration D]",
		Short: "Append numbered records to streams and keep a ledger of what was acknowledged",
		Long: `load produces records at --rate records per second in all, spread evenly over
the streams (default: every stream in the catalog), for --duration or until
--max-records. Each stream's records go to its owner, found through the
catalog (DescribeStream, then the owner's registered broker_addr, or
--broker-addrs); a NOT_OWNER refusal is followed to the owner it names, any
other error re-resolves the owner and retries the same records. With
--brokers instead of --coordinators (brokers in mode automq, whose streams
live at AutoMQ's controller), the leader of a stream is found by asking
each broker which streams it leads, as a Kafka client reads metadata;
--streams is then required.

Each stream's producer is idempotent (Kafka's model): it has a random
producer id, record N of the run is its sequence N, and a failed append is
retried with the same batch, so that a broker that stored it (also another
broker after a failover) answers with the stored offsets instead of storing
it twice (duplicate_acks counts those records). --plain-appends turns this
off, for comparison.

Record N of stream S has the id "S/N"; its payload is the id, '|', and filler
up to --payload bytes. Every acknowledged record becomes one line of the
ledger, flushed every 200ms and fsynced at the end:
  {"stream":S,"offset":O,"id":"S/N"}

The report gives, per stream and in all: generated, acked, errors, pending
(never acknowledged), duplicate_acks, producer_resets (the stream forgot
the producer, which started again with a new id) and max_unavailable_ms (the
longest time without a successful append while records waited); -o json
prints it as JSON.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ids, err := parseStreams(streams)
			if err != nil {
				return err
			}
			am, err := parseAddrMap(addrs)
			if err != nil {
				return err
			}
			dial, brokerDial, err := ct.dialOptions()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, err := loadgen.Load(ctx, loadgen.LoadConfig{
				Coordinators: parseList(coords), Brokers: parseList(brokers), Streams: ids, Rate: rate, Duration: duration,
				MaxRecords: maxRecords, PayloadBytes: payload, Ledger: ledger, BrokerAddrs: am, AppendTimeout: appendTimeout,
				DialOptions: dial, BrokerDialOptions: brokerDial,
				PlainAppends: plain,
			})
			if err != nil {
				return err
			}
			return printLoad(cmd.OutOrStdout(), output, rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&coords, "coordinators", "", "coordinators' admin addresses, comma-separated (required unless --brokers)")
	f.StringVar(&brokers, "brokers", "", "brokers' data API addresses, comma-separated, instead of --coordinators (brokers in mode automq)")
	f.StringVar(&streams, "streams", "", "stream ids, comma-separated (default: every stream in the catalog)")
	f.Float64Var(&rate, "rate", 100, "records per second over all streams")
	f.DurationVar(&duration, "duration", 10*time.Second, "how long to produce")
	f.Int64Var(&maxRecords, "max-records", 0, "records to produce in all (default: rate × duration)")
	f.IntVar(&payload, "payload", 64, "bytes per record")
	f.StringVar(&ledger, "ledger", "", "ledger file of acknowledged records (required; truncated)")
	f.StringVar(&addrs, "broker-addrs", "", "broker_id=host:port overrides of registered broker addresses, comma-separated")
	f.DurationVar(&appendTimeout, "append-timeout", 2*time.Second, "give up one append after this long and resolve the owner again")
	f.BoolVar(&plain, "plain-appends", false, "append without producer id and sequence (retries may store records twice; for comparison)")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	ct.bind(f)
	return cmd
}

func printLoad(w io.Writer, output string, rep *loadgen.LoadReport) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(w, "%-8s %10s %10s %8s %8s %18s  %s\n", "STREAM", "GENERATED", "ACKED", "ERRORS", "PENDING", "MAX_UNAVAILABLE", "OWNERS")
	for _, s := range rep.Streams {
		fmt.Fprintf(w, "%-8d %10d %10d %8d %8d %18s  %s\n", s.Stream, s.Generated, s.Acked, s.Errors, s.Pending,
			(time.Duration(s.MaxUnavailableMs) * time.Millisecond).String(), strings.Join(s.Owners, ","))
	}
	fmt.Fprintf(w, "total: generated %d, acked %d, errors %d, pending %d, retries found stored %d, producer resets %d, max unavailable %dms, median %dms, in %dms\n",
		rep.Generated, rep.Acked, rep.Errors, rep.Pending, rep.DuplicateAcks, rep.ProducerResets, rep.MaxUnavailableMs, rep.MedianUnavailableMs, rep.DurationMs)
	return nil
}
