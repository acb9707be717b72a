package objstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"walden/objformat"
	"walden/objstore"
	"walden/objstore/s3test"
	"walden/wal"
)

// TestServerVerifiesChecksum sends a PUT whose CRC32C does not match its body
// to versitygw, which must refuse it: the checksums Upload sends are checked.
func TestServerVerifiesChecksum(t *testing.T) {
	cfg := s3test.StartVersity(t, "")
	c := newClient(t, cfg, objstore.Options{})
	ctx := ctxT(t)
	_, err := c.S3().PutObject(ctx, &s3.PutObjectInput{
		Bucket:            &cfg.Bucket,
		Key:               ptr("bad-checksum.obj"),
		Body:              strings.NewReader("the body"),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		ChecksumCRC32C:    ptr("AAAAAA=="),
	})
	if err == nil {
		t.Fatal("versitygw accepted a PUT with a wrong CRC32C")
	}
	t.Logf("refused as expected: %v", err)
	if _, err := c.Head(ctx, "bad-checksum.obj"); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("Head after the refused PUT: %v", err)
	}
}

// TestServerKilledMidUpload kills the S3 server after the first part, then
// restarts it on the same directory and address: the upload failed and left
// no object and no incomplete upload.
func TestServerKilledMidUpload(t *testing.T) {
	dir := t.TempDir()
	srv, err := objstore.ServeFake("", dir, nil, s3test.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	c := newClient(t, objstore.FakeConfig(srv.Endpoint, s3test.Bucket), objstore.Options{PartSize: objstore.MinPartSize, Concurrency: 1})
	data := randBytes(20<<20, 4)
	killed := false
	_, err = c.Upload(ctxT(t), "k/killed.obj", bytes.NewReader(data), int64(len(data)), func(int64) {
		if !killed {
			killed = true
			srv.Kill()
		}
	})
	if err == nil || !killed {
		t.Fatalf("upload through a killed server: err %v, killed %v", err, killed)
	}
	srv2, err := objstore.ServeFake(addr, dir, nil, s3test.Bucket)
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = srv2.Close(context.Background()) })
	if _, err := c.AbortIncompleteUploads(ctxT(t), "k/"); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, c, "k/killed.obj")
}

// readerAtOnly hides every method but ReadAt.
type readerAtOnly struct{ r io.ReaderAt }

func (r readerAtOnly) ReadAt(p []byte, off int64) (int, error) { return r.r.ReadAt(p, off) }
func (r readerAtOnly) Read([]byte) (int, error)                { return 0, errors.New("Read must not be called") }

// TestUploadStreamingAndReaderAt uploads an object streamed by
// objformat.Builder.WriteTo through a pipe (size known in advance), and one
// given as an io.ReaderAt.
func TestUploadStreamingAndReaderAt(t *testing.T) {
	c := newClient(t, s3test.StartFake(t), objstore.Options{PartSize: objstore.MinPartSize})
	ctx := ctxT(t)
	b := objformat.NewBuilder()
	payload := randBytes(256<<10, 5)
	for i := uint64(0); i < 30; i++ {
		if err := b.Add(wal.Batch{StreamID: 9, Epoch: 1, BaseOffset: i, Count: 1, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := b.WriteTo(pw)
		pw.CloseWithError(err)
	}()
	res, err := c.Upload(ctx, "s/streamed.obj", pr, b.Size(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if res.Size != int64(len(want)) || res.CRC32C != objformat.CRC32C(want) || res.Parts != 2 {
		t.Fatalf("streamed upload %+v, object %d bytes", res, len(want))
	}
	got, err := c.Get(ctx, "s/streamed.obj")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("streamed object differs: %v", err)
	}
	if _, err := c.Upload(ctx, "s/readerat.obj", readerAtOnly{bytes.NewReader(want)}, int64(len(want)), nil); err != nil {
		t.Fatalf("upload from an io.ReaderAt: %v", err)
	}
	if got, err := c.Get(ctx, "s/readerat.obj"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("io.ReaderAt object differs: %v", err)
	}
	// A range past the end is an error, not short data.
	if _, err := c.GetRange(ctx, "s/readerat.obj", int64(len(want))-2, 10); err == nil {
		t.Fatal("GetRange past the end succeeded")
	}
}
