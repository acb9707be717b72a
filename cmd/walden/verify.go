package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"walden/loadgen"
)

// errVerifyFailed is returned (exit status 1) when records were lost, the
// streams have gaps, a record is stored twice or a committed range is in
// no object.
var errVerifyFailed = errors.New("verify: acknowledged records lost, offsets missing, records stored twice or committed ranges in no object")

func newVerifyCmd() *cobra.Command {
	var coords, ledger, output, addrs string
	var wait time.Duration
	var ct clientTLS
	cmd := &cobra.Command{
		Use:   "verify --coordinators A,B,C --ledger FILE",
		Short: "Check that every record in a load ledger is in its stream at its offset",
		Long: `verify reads every stream named in the ledger back through the brokers' Read
API (the owner first, which also serves its tail not yet uploaded; any other
registered broker serves committed data) from offset 0, waiting up to --wait
for a stream to reach its last acknowledged offset, and checks:

  present     acknowledged records found at their acknowledged offset
  lost        acknowledged records absent or with another record there
  gaps        offsets missing inside the data read back
  duplicates  extra copies of a record id at another offset
  unbacked    committed ranges that no object in the object store backs
              (a broker answers OBJECT_MISSING): listed by stream and
              offsets, with the object the catalog names

It prints {"acked","present","lost","gaps","duplicates","unbacked",
"streams":[...]} with -o json (zero values included) and exits with status 1
when lost > 0, gaps > 0, duplicates > 0 or unbacked > 0 (walden load's
producers are idempotent: a retried append is stored once).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
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
			rep, err := loadgen.Verify(ctx, loadgen.VerifyConfig{Coordinators: parseList(coords), Ledger: ledger, Wait: wait, BrokerAddrs: am,
				DialOptions: dial, BrokerDialOptions: brokerDial})
			if err != nil {
				return err
			}
			if err := printVerify(cmd.OutOrStdout(), output, rep); err != nil {
				return err
			}
			if !rep.OK() {
				return fmt.Errorf("%w: lost %d, gaps %d, duplicates %d, unbacked %d", errVerifyFailed, rep.Lost, rep.Gaps, rep.Duplicates, rep.Unbacked)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&coords, "coordinators", "", "coordinators' admin addresses, comma-separated (required)")
	f.StringVar(&ledger, "ledger", "", "ledger file written by walden load (required)")
	f.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for streams to reach their last acknowledged offset")
	f.StringVar(&addrs, "broker-addrs", "", "broker_id=host:port overrides of registered broker addresses, comma-separated")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	ct.bind(f)
	return cmd
}

func printVerify(w io.Writer, output string, rep *loadgen.VerifyReport) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(w, "%-8s %10s %10s %8s %8s %10s %10s\n", "STREAM", "ACKED", "PRESENT", "LOST", "GAPS", "DUPLICATES", "READ_END")
	for _, s := range rep.Streams {
		fmt.Fprintf(w, "%-8d %10d %10d %8d %8d %10d %10d\n", s.Stream, s.Acked, s.Present, s.Lost, s.Gaps, s.Duplicates, s.ReadEnd)
	}
	for _, s := range rep.Streams {
		for _, u := range s.Unbacked {
			fmt.Fprintf(w, "unbacked: %s\n", u.Message)
		}
	}
	fmt.Fprintf(w, "total: acked %d, present %d, lost %d, gaps %d, duplicates %d, unbacked %d\n", rep.Acked, rep.Present, rep.Lost, rep.Gaps, rep.Duplicates, rep.Unbacked)
	return nil
}
