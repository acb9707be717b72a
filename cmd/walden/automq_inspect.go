package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"walden/automq/object"
	"walden/objstore"
)

func init() { automqCmd.AddCommand(newAutomqInspectCmd()) }

// inspectObjectOut is the JSON of `walden automq inspect-object -o json`.
type inspectObjectOut struct {
	Source string `json:"source"`
	// ObjectID is the id the key names (-1 for a local file whose name is
	// not a key).
	ObjectID int64 `json:"object_id"`
	*object.Description
}

func newAutomqInspectCmd() *cobra.Command {
	var (
		output, endpoint, region string
		pathStyle, records       bool
		clusterID                string
	)
	cmd := &cobra.Command{
		Use:   "inspect-object FILE | s3://BUCKET/KEY",
		Short: "Print an AutoMQ object's index, stream ranges and (with --records) its records",
		Long: `inspect-object reads one AutoMQ 1.x S3 object (a stream-set or a stream object),
from a local file or from S3, as AutoMQ's ObjectReader reads it, checks every
block and record against the index, and prints the object's layout: its
stream ranges (with the epoch of each stream's first record), each data
block's index entry, and with --records each record's header (stream, epoch,
base offset, count, payload length). A damaged object is refused with what
was expected where. It never writes.

For s3:// the credentials come from the AWS SDK's usual chain
(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role).
With --cluster-id, the key is checked against AutoMQ's key rule and the
object id it names is printed.`,
		Example: `  walden automq inspect-object 10000000/_kafka_rZdE0DjZSrqy96PXrMUZVw/1 --records
  walden automq inspect-object s3://automq-data/edcba000/_kafka_prod/703710 --cluster-id prod -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("inspect-object: -o: must be table or json, not %q", output)
			}
			r, size, id, closeFn, err := openObject(cmd.Context(), args[0], clusterID, objstore.Config{Endpoint: endpoint, Region: region, PathStyle: pathStyle})
			if err != nil {
				return fmt.Errorf("inspect-object: %w", err)
			}
			defer closeFn()
			d, err := object.Describe(r, size, object.DescribeOptions{Records: records})
			if err != nil {
				return fmt.Errorf("inspect-object: %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(inspectObjectOut{Source: args[0], ObjectID: id, Description: d})
			}
			printObject(out, args[0], id, d)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&output, "output", "o", "table", "output format: table or json")
	fl.BoolVar(&records, "records", false, "list every record's header")
	fl.StringVar(&clusterID, "cluster-id", "", "the AutoMQ cluster id: check the key against AutoMQ's key rule")
	fl.StringVar(&endpoint, "s3-endpoint", "", "the S3 endpoint URL for s3:// (default: AWS's)")
	fl.StringVar(&region, "s3-region", "us-east-1", "the bucket's region for s3://")
	fl.BoolVar(&pathStyle, "s3-path-style", false, "address the bucket in the path for s3:// (MinIO and other S3-compatible servers)")
	return cmd
}

// openObject opens a local file or an s3:// object for reading.
func openObject(ctx context.Context, src, clusterID string, s3cfg objstore.Config) (io.ReaderAt, int64, int64, func(), error) {
	id := int64(-1)
	key := src
	if rest, ok := strings.CutPrefix(src, "s3://"); ok {
		bucket, k, found := strings.Cut(rest, "/")
		if !found || bucket == "" || k == "" {
			return nil, 0, 0, nil, fmt.Errorf("%q: want s3://BUCKET/KEY", src)
		}
		key = k
		s3cfg.Bucket = bucket
		if clusterID != "" {
			var err error
			if id, err = object.ParseKey(clusterID, key); err != nil {
				return nil, 0, 0, nil, err
			}
		}
		c, err := objstore.New(ctx, s3cfg, objstore.Options{})
		if err != nil {
			return nil, 0, 0, nil, err
		}
		info, err := c.Head(ctx, key)
		if err != nil {
			return nil, 0, 0, nil, err
		}
		return c.ReaderAt(ctx, key, info.Size), info.Size, id, func() {}, nil
	}
	if clusterID != "" {
		var err error
		if id, err = object.ParseKey(clusterID, key); err != nil {
			return nil, 0, 0, nil, fmt.Errorf("%w (the file's path is checked as a key: give the path relative to the bucket's root)", err)
		}
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, 0, 0, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, 0, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, 0, nil, errors.New(src + " is not a regular file")
	}
	return f, st.Size(), id, func() { f.Close() }, nil
}

func printObject(w io.Writer, src string, id int64, d *object.Description) {
	idText := ""
	if id >= 0 {
		idText = fmt.Sprintf(" (object %d)", id)
	}
	fmt.Fprintf(w, "%s%s: %d bytes, %s, %s, %d bytes of payload; index at %d (%d bytes)\n", src, idText, d.Size,
		countText(int64(len(d.Blocks)), "block", "blocks"), countText(d.RecordCount, "record", "records"), d.PayloadBytes, d.IndexPosition, d.IndexSize)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tEPOCH\tSTART\tEND")
	for _, s := range d.Streams {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\n", s.StreamID, s.Epoch, s.StartOffset, s.EndOffset)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BLOCK\tSTREAM\tSTART\tEND\tRECORDS\tPOSITION\tSIZE")
	for _, b := range d.Blocks {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\n", b.Block, b.StreamID, b.StartOffset, b.EndOffset, b.RecordCount, b.Position, b.Size)
		for _, r := range b.Records {
			fmt.Fprintf(tw, "\t  record\t%d\t+%d\tepoch %d\t%d bytes\t\n", r.BaseOffset, r.Count, r.Epoch, r.PayloadLen)
		}
	}
	tw.Flush()
}
