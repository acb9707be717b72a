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
	"github.com/spf13/pflag"

	"walden/loadgen"
	"walden/objstore"
)

// errVerifyFailed is returned (exit status 1) when records were lost, the
// streams have gaps, a record is stored twice or a committed range is in
// no object.
var errVerifyFailed = errors.New("verify: acknowledged records lost, offsets missing, records stored twice or committed ranges in no object")

func newVerifyCmd() *cobra.Command {
	var coords, ledger, output, addrs, automqView string
	var wait time.Duration
	var ct clientTLS
	var s3 s3Flags
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
producers are idempotent: a retried append is stored once).

With --automq URL (the AutoMQ controller's metadata view: the development
controller's HTTP endpoint) and the --s3-* flags of AutoMQ's data bucket, it
reads no broker: each stream's records come from the committed objects the
controller lists, in AutoMQ's object format, from offset 0 to the stream's
end offset at the controller, waiting up to --wait for that end offset to
reach the stream's last acknowledged offset; unbacked counts the ranges
whose object is not in the bucket. S3 credentials come from the AWS SDK's
usual chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY...).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var rep *loadgen.VerifyReport
			if automqView != "" {
				if coords != "" {
					return errors.New("verify: --coordinators: not with --automq (AutoMQ's streams are read from the controller and S3)")
				}
				var err error
				rep, err = loadgen.VerifyAutomq(ctx, loadgen.AutomqVerifyConfig{MetadataURL: automqView, S3: s3.config(), Ledger: ledger, Wait: wait})
				if err != nil {
					return err
				}
				return finishVerify(cmd.OutOrStdout(), output, rep)
			}
			am, err := parseAddrMap(addrs)
			if err != nil {
				return err
			}
			dial, brokerDial, err := ct.dialOptions()
			if err != nil {
				return err
			}
			rep, err = loadgen.Verify(ctx, loadgen.VerifyConfig{Coordinators: parseList(coords), Ledger: ledger, Wait: wait, BrokerAddrs: am,
				DialOptions: dial, BrokerDialOptions: brokerDial})
			if err != nil {
				return err
			}
			return finishVerify(cmd.OutOrStdout(), output, rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&coords, "coordinators", "", "coordinators' admin addresses, comma-separated (required)")
	f.StringVar(&ledger, "ledger", "", "ledger file written by walden load (required)")
	f.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for streams to reach their last acknowledged offset")
	f.StringVar(&addrs, "broker-addrs", "", "broker_id=host:port overrides of registered broker addresses, comma-separated")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringVar(&automqView, "automq", "", "the AutoMQ controller's metadata view URL: read the streams from AutoMQ's objects in S3, not through brokers")
	s3.bind(f)
	ct.bind(f)
	return cmd
}

// finishVerify prints the report and fails when it is not OK.
func finishVerify(w io.Writer, output string, rep *loadgen.VerifyReport) error {
	if err := printVerify(w, output, rep); err != nil {
		return err
	}
	if !rep.OK() {
		return fmt.Errorf("%w: lost %d, gaps %d, duplicates %d, unbacked %d", errVerifyFailed, rep.Lost, rep.Gaps, rep.Duplicates, rep.Unbacked)
	}
	return nil
}

// s3Flags are the --s3-* flags naming a bucket (credentials from the AWS
// SDK's chain).
type s3Flags struct {
	endpoint, bucket, region string
	pathStyle                bool
}

func (s *s3Flags) bind(f *pflag.FlagSet) {
	f.StringVar(&s.endpoint, "s3-endpoint", "", "S3 endpoint URL (default: AWS S3 in --s3-region)")
	f.StringVar(&s.bucket, "s3-bucket", "", "S3 bucket (AutoMQ's data bucket)")
	f.StringVar(&s.region, "s3-region", "us-east-1", "S3 region")
	f.BoolVar(&s.pathStyle, "s3-path-style", false, "path-style addressing (local S3 servers)")
}

func (s *s3Flags) config() objstore.Config {
	return objstore.Config{Endpoint: s.endpoint, Bucket: s.bucket, Region: s.region, PathStyle: s.pathStyle}
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
