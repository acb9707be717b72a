package objstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"walden/objformat"
	"walden/objstore"
	"walden/objstore/s3test"
	"walden/wal"
)

func newClient(t testing.TB, cfg objstore.Config, opts objstore.Options) *objstore.Client {
	t.Helper()
	c, err := objstore.New(context.Background(), cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestBasic runs the whole API against each backend.
func TestBasic(t *testing.T) {
	for name, start := range s3test.Backends() {
		t.Run(name, func(t *testing.T) {
			cfg := start(t)
			c := newClient(t, cfg, objstore.Options{})
			ctx := ctxT(t)
			if err := c.EnsureBucket(ctx); err != nil {
				t.Fatalf("EnsureBucket on an existing bucket: %v", err)
			}
			data := []byte("hello, walden")
			var last int64
			res, err := c.Upload(ctx, "p/a/one.obj", bytes.NewReader(data), int64(len(data)), func(n int64) { last = n })
			if err != nil {
				t.Fatalf("Upload: %v", err)
			}
			if res.Size != int64(len(data)) || res.CRC32C != objformat.CRC32C(data) || res.Parts != 1 || res.ETag == "" || last != int64(len(data)) {
				t.Fatalf("Upload result %+v, progress %d", res, last)
			}
			got, err := c.Get(ctx, "p/a/one.obj")
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("Get = %q, %v", got, err)
			}
			part, err := c.GetRange(ctx, "p/a/one.obj", 7, 6)
			if err != nil || string(part) != "walden" {
				t.Fatalf("GetRange = %q, %v", part, err)
			}
			info, err := c.Head(ctx, "p/a/one.obj")
			if err != nil || info.Size != int64(len(data)) {
				t.Fatalf("Head = %+v, %v", info, err)
			}
			if _, err := c.Upload(ctx, "p/b/two.obj", strings.NewReader("2"), 1, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Upload(ctx, "q/three.obj", strings.NewReader("3"), 1, nil); err != nil {
				t.Fatal(err)
			}
			list, err := c.List(ctx, "p/")
			if err != nil || len(list) != 2 || list[0].Key != "p/a/one.obj" || list[1].Key != "p/b/two.obj" {
				t.Fatalf("List = %+v, %v", list, err)
			}
			if err := c.Delete(ctx, "p/a/one.obj"); err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, "p/a/one.obj"); err != nil {
				t.Fatalf("deleting a missing object: %v", err)
			}
			if _, err := c.Get(ctx, "p/a/one.obj"); !errors.Is(err, objstore.ErrNotFound) {
				t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
			}
			if _, err := c.Head(ctx, "p/a/one.obj"); !errors.Is(err, objstore.ErrNotFound) {
				t.Fatalf("Head after Delete = %v, want ErrNotFound", err)
			}
			// A size that disagrees with the body leaves nothing.
			if _, err := c.Upload(ctx, "p/short.obj", strings.NewReader("abc"), 5, nil); !errors.Is(err, objstore.ErrShortBody) {
				t.Fatalf("short body: %v", err)
			}
			if _, err := c.Head(ctx, "p/short.obj"); !errors.Is(err, objstore.ErrNotFound) {
				t.Fatalf("short body left an object: %v", err)
			}
		})
	}
}

// TestMultipartObjectFormat uploads a ~20 MiB object in 5 MiB parts sent in
// parallel and reads it back through objformat, whole and by ranges.
func TestMultipartObjectFormat(t *testing.T) {
	for name, start := range s3test.Backends() {
		t.Run(name, func(t *testing.T) {
			cfg := start(t)
			c := newClient(t, cfg, objstore.Options{PartSize: objstore.MinPartSize, Concurrency: 4})
			ctx := ctxT(t)
			b := objformat.NewBuilder()
			payload := randBytes(1<<20, 1)
			for i := 0; i < 20; i++ {
				if err := b.Add(wal.Batch{StreamID: uint64(i % 3), Epoch: 1, BaseOffset: uint64(i/3) * 10, Count: 10, Payload: payload}); err != nil {
					t.Fatal(err)
				}
			}
			data, ix, err := b.Build()
			if err != nil {
				t.Fatal(err)
			}
			key := objformat.Key("walden", "broker-1", 2, 16384, 99999)
			var calls []int64
			var mu sync.Mutex
			res, err := c.Upload(ctx, key, bytes.NewReader(data), int64(len(data)), func(n int64) {
				mu.Lock()
				calls = append(calls, n)
				mu.Unlock()
			})
			if err != nil {
				t.Fatalf("Upload: %v", err)
			}
			if res.Parts != 5 || res.CRC32C != objformat.CRC32C(data) {
				t.Fatalf("result %+v", res)
			}
			if len(calls) < 2 || calls[len(calls)-1] != int64(len(data)) {
				t.Fatalf("progress calls %v, want several ending at %d", calls, len(data))
			}
			for i := 1; i < len(calls); i++ {
				if calls[i] <= calls[i-1] {
					t.Fatalf("progress not increasing: %v", calls)
				}
			}
			t.Logf("%s: %d bytes in %d parts, S3 checksum %q", name, len(data), res.Parts, res.ChecksumCRC32C)
			if name == "versitygw" && !strings.HasSuffix(res.ChecksumCRC32C, "-5") {
				// The composite CRC32C of 5 parts: S3 had a CRC32C for each.
				t.Errorf("versitygw checksum %q, want a composite of 5 parts", res.ChecksumCRC32C)
			}
			got, err := c.Get(ctx, key)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("Get: %v (equal %v)", err, bytes.Equal(got, data))
			}
			rix, err := objformat.ReadIndex(c.ReaderAt(ctx, key, int64(len(data))), int64(len(data)))
			if err != nil || len(rix.Entries) != len(ix.Entries) {
				t.Fatalf("ReadIndex over ranged GETs: %v", err)
			}
			bs, err := objformat.ReadSection(c.ReaderAt(ctx, key, int64(len(data))), rix.Entries[2])
			if err != nil || len(bs) != 6 || !bytes.Equal(bs[5].Payload, payload) {
				t.Fatalf("ReadSection: %d batches, %v", len(bs), err)
			}
			if ups, err := c.ListIncompleteUploads(ctx, ""); err != nil || len(ups) != 0 {
				t.Fatalf("incomplete uploads after success: %v, %v", ups, err)
			}
		})
	}
}

// failingParts wraps a handler so that every UploadPart of part 3 fails
// with a 500 (after the SDK's retries the upload fails mid-way), and counts
// the aborts it sees.
type failingParts struct {
	h         http.Handler
	aborts    atomic.Int32
	parts     atomic.Int32
	unchecked atomic.Int32
}

func (f *failingParts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method == http.MethodPut && q.Get("partNumber") != "" {
		f.parts.Add(1)
		// The CRC32C travels as a header or as a trailer of an aws-chunked
		// body.
		if r.Header.Get("X-Amz-Checksum-Crc32c") == "" && !strings.Contains(strings.ToLower(r.Header.Get("X-Amz-Trailer")), "x-amz-checksum-crc32c") {
			f.unchecked.Add(1)
		}
		if q.Get("partNumber") == "3" {
			io.Copy(io.Discard, r.Body)
			http.Error(w, "<Error><Code>InternalError</Code><Message>injected</Message></Error>", http.StatusInternalServerError)
			return
		}
	}
	if r.Method == http.MethodDelete && q.Get("uploadId") != "" {
		f.aborts.Add(1)
	}
	f.h.ServeHTTP(w, r)
}

// uploaders are the client's two ways to upload: through the transfer
// manager (Upload) and in place (UploadAt).
var uploaders = map[string]func(c *objstore.Client, ctx context.Context, key string, data []byte, progress func(int64)) (objstore.UploadResult, error){
	"Upload": func(c *objstore.Client, ctx context.Context, key string, data []byte, progress func(int64)) (objstore.UploadResult, error) {
		return c.Upload(ctx, key, bytes.NewReader(data), int64(len(data)), progress)
	},
	"UploadAt": func(c *objstore.Client, ctx context.Context, key string, data []byte, progress func(int64)) (objstore.UploadResult, error) {
		return c.UploadAt(ctx, key, bytes.NewReader(data), int64(len(data)), progress)
	},
}

func TestFailedUploadLeavesNothing(t *testing.T) {
	for name, upload := range uploaders {
		t.Run(name, func(t *testing.T) {
			h, err := objstore.NewFakeHandler(t.TempDir(), nil, s3test.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			fp := &failingParts{h: h}
			srv := httptest.NewServer(fp)
			defer srv.Close()
			c := newClient(t, objstore.FakeConfig(srv.URL, s3test.Bucket), objstore.Options{PartSize: objstore.MinPartSize, Concurrency: 2})
			ctx := ctxT(t)
			data := randBytes(20<<20, 2)
			_, err = upload(c, ctx, "x/failed.obj", data, nil)
			if err == nil {
				t.Fatal("upload with a failing part succeeded")
			}
			if fp.unchecked.Load() != 0 || fp.parts.Load() == 0 {
				t.Errorf("%d of %d parts were sent without a CRC32C", fp.unchecked.Load(), fp.parts.Load())
			}
			if fp.aborts.Load() == 0 {
				t.Errorf("the multipart upload was not aborted (%d part requests)", fp.parts.Load())
			}
			assertNothingLeft(t, c, "x/failed.obj")
		})
	}
}

func TestCancelledUploadLeavesNothing(t *testing.T) {
	for name, start := range s3test.Backends() {
		for how, upload := range uploaders {
			t.Run(name+"/"+how, func(t *testing.T) {
				cfg := start(t)
				c := newClient(t, cfg, objstore.Options{PartSize: objstore.MinPartSize, Concurrency: 2})
				ctx, cancel := context.WithCancel(ctxT(t))
				data := randBytes(20<<20, 3)
				_, err := upload(c, ctx, "x/cancelled.obj", data, func(done int64) {
					cancel() // after the first part is acknowledged
				})
				if err == nil {
					t.Fatal("cancelled upload succeeded")
				}
				// Upload itself cleans up: no AbortIncompleteUploads here.
				assertNothingLeft(t, c, "x/cancelled.obj")
			})
		}
	}
}

// TestUploadAtRoundTrip uploads in place an empty object, a single PUT and
// multipart objects (a last part shorter than the others, and more parts
// than workers) to every backend: S3 holds the same bytes, the progress
// rises to the size, and the result counts the parts.
func TestUploadAtRoundTrip(t *testing.T) {
	for name, start := range s3test.Backends() {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, start(t), objstore.Options{PartSize: objstore.MinPartSize, Concurrency: 2})
			ctx := ctxT(t)
			for _, tc := range []struct {
				size  int
				parts int
			}{{0, 1}, {1000, 1}, {objstore.MinPartSize, 1}, {2*objstore.MinPartSize + 123, 3}, {5 * objstore.MinPartSize, 5}} {
				data := randBytes(tc.size, uint64(tc.size))
				key := fmt.Sprintf("at/%d.obj", tc.size)
				var last int64
				res, err := c.UploadAt(ctx, key, bytes.NewReader(data), int64(len(data)), func(done int64) {
					if done <= last && done > 0 {
						t.Errorf("progress %d after %d", done, last)
					}
					last = done
				})
				if err != nil {
					t.Fatalf("%d bytes: %v", tc.size, err)
				}
				if res.Size != int64(tc.size) || res.Parts != tc.parts || res.ETag == "" || (tc.size > 0 && last != int64(tc.size)) {
					t.Fatalf("%d bytes: result %+v, progress ended at %d", tc.size, res, last)
				}
				got, err := c.Get(ctx, key)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%d bytes: read back %d bytes, %v", tc.size, len(got), err)
				}
			}
		})
	}
}

func TestAbortIncompleteUploads(t *testing.T) {
	for name, start := range s3test.Backends() {
		t.Run(name, func(t *testing.T) {
			cfg := start(t)
			c := newClient(t, cfg, objstore.Options{})
			ctx := ctxT(t)
			// A multipart upload started by a crashed attempt.
			if _, err := c.S3().CreateMultipartUpload(ctx, &s3CreateInput{Bucket: &cfg.Bucket, Key: ptr("y/crashed.obj")}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.S3().CreateMultipartUpload(ctx, &s3CreateInput{Bucket: &cfg.Bucket, Key: ptr("z/other.obj")}); err != nil {
				t.Fatal(err)
			}
			ups, err := c.ListIncompleteUploads(ctx, "y/")
			if err != nil || len(ups) != 1 || ups[0].Key != "y/crashed.obj" {
				t.Fatalf("ListIncompleteUploads = %+v, %v", ups, err)
			}
			n, err := c.AbortIncompleteUploads(ctx, "y/")
			if err != nil || n != 1 {
				t.Fatalf("AbortIncompleteUploads = %d, %v", n, err)
			}
			assertNothingLeft(t, c, "y/crashed.obj")
			if ups, _ := c.ListIncompleteUploads(ctx, "z/"); len(ups) != 1 {
				t.Fatalf("an upload outside the prefix was aborted: %+v", ups)
			}
		})
	}
}

func assertNothingLeft(t *testing.T, c *objstore.Client, key string) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := c.Head(ctx, key); !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("Head %s = %v, want ErrNotFound", key, err)
	}
	ups, err := c.ListIncompleteUploads(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range ups {
		if u.Key == key {
			t.Errorf("incomplete multipart upload left for %s: %s", key, u.UploadID)
		}
	}
}

func TestEnsureBucketCreates(t *testing.T) {
	cfg := s3test.StartFake(t)
	cfg.Bucket = "another-bucket"
	c := newClient(t, cfg, objstore.Options{})
	ctx := ctxT(t)
	if _, err := c.Upload(ctx, "k", strings.NewReader("v"), 1, nil); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("upload to a missing bucket: %v", err)
	}
	if err := c.EnsureBucket(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, "k", strings.NewReader("v"), 1, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCredentialFallback(t *testing.T) {
	cfg := s3test.StartFake(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "from-env")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	cfg.AccessKeyID, cfg.SecretAccessKey = "", ""
	c := newClient(t, cfg, objstore.Options{})
	ctx := ctxT(t)
	src, err := c.Credentials(ctx)
	if err != nil || src != "EnvConfigCredentials" {
		t.Fatalf("Credentials = %q, %v; want the environment", src, err)
	}
	cr, err := c.S3().Options().Credentials.Retrieve(ctx)
	if err != nil || cr.AccessKeyID != "from-env" {
		t.Fatalf("resolved %q, %v", cr.AccessKeyID, err)
	}
	if _, err := c.Upload(ctx, "cred.obj", strings.NewReader("x"), 1, nil); err != nil {
		t.Fatalf("upload with environment credentials: %v", err)
	}
	static := newClient(t, s3test.StartFake(t), objstore.Options{})
	if src, _ := static.Credentials(ctx); src != "static" {
		t.Fatalf("static Credentials = %q", src)
	}
}

func TestConfigValidate(t *testing.T) {
	good := objstore.FakeConfig("http://127.0.0.1:9000", "b")
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for key, mut := range map[string]func(*objstore.Config){
		"s3.bucket":        func(c *objstore.Config) { c.Bucket = "" },
		"s3.region":        func(c *objstore.Config) { c.Region = "" },
		"s3.endpoint":      func(c *objstore.Config) { c.Endpoint = "127.0.0.1:9000" },
		"s3.access_key_id": func(c *objstore.Config) { c.SecretAccessKey = "" },
		"s3.prefix":        func(c *objstore.Config) { c.Prefix = "/abs" },
	} {
		c := good
		mut(&c)
		err := c.Validate()
		if !errors.Is(err, objstore.ErrInvalidConfig) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: Validate = %v", key, err)
		}
	}
	if _, err := objstore.New(context.Background(), good, objstore.Options{PartSize: 1 << 20}); !errors.Is(err, objstore.ErrInvalidConfig) {
		t.Errorf("small part size: %v", err)
	}
	if d := objstore.DefaultConfig(); d.Region != "us-east-1" {
		t.Errorf("DefaultConfig = %+v", d)
	}
}
