package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	tm "github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	tmtypes "github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// abortTimeout bounds the cleanup of a failed multipart upload, which runs
// on a fresh context so that it also happens after the caller cancelled.
const abortTimeout = 30 * time.Second

// Client reads and writes objects in one bucket. It is safe for concurrent
// use.
type Client struct {
	cfg    Config
	opts   Options
	s3     *s3.Client
	tm     *tm.Client
	log    *slog.Logger
	static bool
}

// New validates cfg and opts and returns a Client. With empty access keys
// the credentials come from the standard AWS chain
// (config.LoadDefaultConfig); nothing is sent to S3 until the first call.
func New(ctx context.Context, cfg Config, opts Options) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	loadOpts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(cfg.Region)}
	if cfg.AccessKeyID != "" {
		loadOpts = append(loadOpts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("objstore: load AWS config: %w", err)
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		if opts.HTTPClient != nil {
			o.HTTPClient = opts.HTTPClient
		}
		// Whole-object reads of multipart objects carry composite
		// checksums the SDK cannot validate; do not log each skip.
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	c := &Client{
		cfg:    cfg,
		opts:   opts,
		s3:     client,
		log:    opts.Logger.With("bucket", cfg.Bucket),
		static: cfg.AccessKeyID != "",
	}
	c.tm = tm.New(client, func(o *tm.Options) {
		o.Concurrency = opts.Concurrency
		o.PartSizeBytes = opts.PartSize
		o.MultipartUploadThreshold = opts.PartSize
		o.ChecksumAlgorithm = tmtypes.ChecksumAlgorithmCrc32c
		o.FailTimeout = abortTimeout
	})
	return c, nil
}

// Bucket returns the bucket the client works on.
func (c *Client) Bucket() string { return c.cfg.Bucket }

// Prefix returns the configured key prefix.
func (c *Client) Prefix() string { return c.cfg.Prefix }

// S3 returns the underlying SDK client, for operations this package does not
// wrap.
func (c *Client) S3() *s3.Client { return c.s3 }

// Credentials reports where the client's credentials come from: "static"
// (access keys in the config) or the name of the provider that the default
// chain resolved (e.g. "EnvConfigCredentials"). It resolves them, which may
// contact an identity service when the chain reaches one.
func (c *Client) Credentials(ctx context.Context) (string, error) {
	if c.static {
		return "static", nil
	}
	cr, err := c.s3.Options().Credentials.Retrieve(ctx)
	if err != nil {
		return "", fmt.Errorf("objstore: resolve credentials: %w", err)
	}
	return cr.Source, nil
}

// UploadResult describes a finished upload.
type UploadResult struct {
	// Key is the object key.
	Key string
	// Size is the number of bytes uploaded.
	Size int64
	// ETag is the object's ETag as S3 returned it.
	ETag string
	// ChecksumCRC32C is S3's checksum of the object (base64; for a
	// multipart upload the composite "<checksum of part checksums>-<parts>"
	// form), empty when the server does not return one.
	ChecksumCRC32C string
	// CRC32C is the whole-body CRC32C computed while uploading, the value
	// the catalog records (Object.crc32c).
	CRC32C uint32
	// Parts is 1 for a single PUT, the part count for a multipart upload.
	Parts int
}

// Upload writes size bytes read from body to key, through the transfer
// manager: a single PUT up to PartSize, otherwise a multipart upload of
// PartSize parts sent Concurrency at a time. Every request carries a CRC32C
// checksum that S3 verifies. progress, if not nil, is called with the
// cumulative number of bytes S3 has acknowledged, ending at size on success;
// the calls are serialised and their values strictly increase.
//
// On failure the multipart upload is aborted (with a fresh context, so also
// after ctx is cancelled) and no object is created; a body whose length is
// not size returns ErrShortBody and leaves nothing under key.
//
// If body is an io.ReaderAt that is not an io.Seeker it is read through an
// io.SectionReader of [0, size).
func (c *Client) Upload(ctx context.Context, key string, body io.Reader, size int64, progress func(done int64)) (UploadResult, error) {
	if size < 0 {
		return UploadResult{}, fmt.Errorf("objstore: upload %s: negative size %d", key, size)
	}
	if _, ok := body.(io.Seeker); !ok {
		if ra, ok := body.(io.ReaderAt); ok {
			body = io.NewSectionReader(ra, 0, size)
		}
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	cr := &countingReader{r: io.LimitReader(body, size+1), h: h}
	in := &tm.UploadObjectInput{
		Bucket:        aws.String(c.cfg.Bucket),
		Key:           aws.String(key),
		Body:          cr,
		ContentLength: aws.Int64(size),
	}
	var optFns []func(*tm.Options)
	var pl *progressListener
	if progress != nil {
		pl = &progressListener{fn: progress}
		optFns = append(optFns, func(o *tm.Options) { o.ObjectProgressListeners.Register(pl) })
	}
	start := time.Now()
	out, err := c.tm.UploadObject(ctx, in, optFns...)
	if err != nil {
		var mf tm.MultipartUploadError
		if errors.As(err, &mf) && mf.UploadID() != "" {
			c.cleanupUpload(ctx, key, mf.UploadID())
		}
		return UploadResult{}, fmt.Errorf("objstore: upload %s/%s: %w", c.cfg.Bucket, key, c.mapErr(err))
	}
	if cr.n != size {
		// The object holds the wrong bytes: remove it before reporting.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
		defer cancel()
		if derr := c.Delete(dctx, key); derr != nil {
			c.log.Warn("delete object after a size mismatch failed", "key", key, "err", derr)
		}
		return UploadResult{}, fmt.Errorf("objstore: upload %s/%s: read %d bytes, declared %d: %w", c.cfg.Bucket, key, cr.n, size, ErrShortBody)
	}
	parts := 1
	if size > c.opts.PartSize {
		parts = int((size + c.opts.PartSize - 1) / c.opts.PartSize)
	}
	res := UploadResult{
		Key:            key,
		Size:           size,
		ETag:           aws.ToString(out.ETag),
		ChecksumCRC32C: aws.ToString(out.ChecksumCRC32C),
		CRC32C:         h.Sum32(),
		Parts:          parts,
	}
	c.log.Debug("uploaded object", "key", key, "bytes", size, "parts", parts, "elapsed", time.Since(start))
	return res, nil
}

// cleanupUpload makes sure a failed multipart upload is gone. The transfer
// manager has already asked S3 to abort it, but a server may still be
// writing a part whose request was cancelled, and some (versitygw) recreate
// the upload when that write ends after the abort. So the upload is looked
// for until it has been absent twice in a row, aborting it again whenever it
// shows up. It runs on a fresh context: the caller's may be cancelled.
func (c *Client) cleanupUpload(ctx context.Context, key, uploadID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	absent := 0
	for round := 0; round < 10 && absent < 2; round++ {
		if round > 0 {
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return
			}
		}
		ups, err := c.ListIncompleteUploads(ctx, key)
		if err != nil {
			c.log.Warn("list multipart uploads after a failed upload", "key", key, "upload_id", uploadID, "err", err)
			return
		}
		found := false
		for _, u := range ups {
			if u.Key == key && u.UploadID == uploadID {
				found = true
			}
		}
		if !found {
			absent++
			continue
		}
		absent = 0
		_, err = c.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
			Bucket: aws.String(c.cfg.Bucket), Key: aws.String(key), UploadId: aws.String(uploadID),
		})
		if err != nil && !errors.Is(c.mapErr(err), ErrNotFound) {
			c.log.Warn("abort failed multipart upload", "key", key, "upload_id", uploadID, "err", err)
		}
	}
}

type countingReader struct {
	r io.Reader
	h hash.Hash32
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}

// progressListener forwards the transfer manager's cumulative byte counts,
// which part workers report concurrently, as one increasing sequence.
type progressListener struct {
	mu   sync.Mutex
	last int64
	fn   func(int64)
}

func (p *progressListener) OnObjectBytesTransferred(_ context.Context, e *tm.ObjectBytesTransferredEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.BytesTransferred > p.last {
		p.last = e.BytesTransferred
		p.fn(e.BytesTransferred)
	}
}

// Get returns the whole object.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	out, err := c.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(c.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		return nil, fmt.Errorf("objstore: get %s/%s: %w", c.cfg.Bucket, key, c.mapErr(err))
	}
	defer out.Body.Close()
	var buf bytes.Buffer
	if n := aws.ToInt64(out.ContentLength); n > 0 {
		buf.Grow(int(n))
	}
	if _, err := io.Copy(&buf, out.Body); err != nil {
		return nil, fmt.Errorf("objstore: get %s/%s: read body: %w", c.cfg.Bucket, key, err)
	}
	return buf.Bytes(), nil
}

// GetRange returns n bytes of the object starting at off. A range reaching
// past the end of the object returns io.ErrUnexpectedEOF (wrapped) with no
// data.
func (c *Client) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if off < 0 || n <= 0 {
		return nil, fmt.Errorf("objstore: get %s/%s: invalid range off %d length %d", c.cfg.Bucket, key, off, n)
	}
	out, err := c.s3.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(c.cfg.Bucket),
		Key:    aws.String(key),
		Range:  aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
	})
	if err != nil {
		return nil, fmt.Errorf("objstore: get %s/%s range %d+%d: %w", c.cfg.Bucket, key, off, n, c.mapErr(err))
	}
	defer out.Body.Close()
	// A server that ignores Range answers with the whole object: refuse it
	// rather than return the object's first n bytes.
	if cr := aws.ToString(out.ContentRange); !strings.HasPrefix(cr, fmt.Sprintf("bytes %d-%d/", off, off+n-1)) {
		return nil, fmt.Errorf("objstore: get %s/%s range %d+%d: server answered Content-Range %q: %w", c.cfg.Bucket, key, off, n, cr, io.ErrUnexpectedEOF)
	}
	buf := make([]byte, n)
	got, err := io.ReadFull(out.Body, buf)
	if err != nil {
		return nil, fmt.Errorf("objstore: get %s/%s range %d+%d: got %d bytes: %w", c.cfg.Bucket, key, off, n, got, io.ErrUnexpectedEOF)
	}
	return buf, nil
}

// ReaderAt returns an io.ReaderAt over an object of the given size that
// issues one ranged GET per ReadAt, so that objformat.ReadIndex and
// ReadSection can read an object in S3 without downloading all of it.
func (c *Client) ReaderAt(ctx context.Context, key string, size int64) io.ReaderAt {
	return &objectReaderAt{ctx: ctx, c: c, key: key, size: size}
}

type objectReaderAt struct {
	ctx  context.Context
	c    *Client
	key  string
	size int64
}

func (r *objectReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("objstore: read %s: negative offset", r.key)
	}
	if off >= r.size {
		return 0, io.EOF
	}
	n := int64(len(p))
	var eof error
	if off+n > r.size {
		n, eof = r.size-off, io.EOF
	}
	if n == 0 {
		return 0, eof
	}
	b, err := r.c.GetRange(r.ctx, r.key, off, n)
	if err != nil {
		return 0, err
	}
	return copy(p, b), eof
}

// ObjectInfo describes an object.
type ObjectInfo struct {
	Key          string
	Size         int64
	ETag         string
	LastModified time.Time
}

// Head returns the object's metadata, or ErrNotFound.
func (c *Client) Head(ctx context.Context, key string) (ObjectInfo, error) {
	out, err := c.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(c.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("objstore: head %s/%s: %w", c.cfg.Bucket, key, c.mapErr(err))
	}
	return ObjectInfo{
		Key:          key,
		Size:         aws.ToInt64(out.ContentLength),
		ETag:         aws.ToString(out.ETag),
		LastModified: aws.ToTime(out.LastModified),
	}, nil
}

// Delete removes the object; deleting a missing object succeeds.
func (c *Client) Delete(ctx context.Context, key string) error {
	_, err := c.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(c.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		err = c.mapErr(err)
		if errors.Is(err, ErrNotFound) && !c.bucketMissing(err) {
			return nil
		}
		return fmt.Errorf("objstore: delete %s/%s: %w", c.cfg.Bucket, key, err)
	}
	return nil
}

// List returns every object whose key starts with prefix, in key order.
func (c *Client) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var objs []ObjectInfo
	p := s3.NewListObjectsV2Paginator(c.s3, &s3.ListObjectsV2Input{Bucket: aws.String(c.cfg.Bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("objstore: list %s/%s: %w", c.cfg.Bucket, prefix, c.mapErr(err))
		}
		for _, o := range page.Contents {
			objs = append(objs, ObjectInfo{
				Key:          aws.ToString(o.Key),
				Size:         aws.ToInt64(o.Size),
				ETag:         aws.ToString(o.ETag),
				LastModified: aws.ToTime(o.LastModified),
			})
		}
	}
	return objs, nil
}

// PendingUpload describes an incomplete multipart upload.
type PendingUpload struct {
	Key      string
	UploadID string
}

// ListIncompleteUploads returns the multipart uploads under prefix that
// were started and neither completed nor aborted.
func (c *Client) ListIncompleteUploads(ctx context.Context, prefix string) ([]PendingUpload, error) {
	var ups []PendingUpload
	in := &s3.ListMultipartUploadsInput{Bucket: aws.String(c.cfg.Bucket), Prefix: aws.String(prefix)}
	for page := 0; page < 10000; page++ {
		out, err := c.s3.ListMultipartUploads(ctx, in)
		if err != nil && hasCode(err, "NoSuchUpload") {
			// gofakes3 answers so for a bucket that has never had an
			// upload since it started: there is none.
			return ups, nil
		}
		if err != nil {
			return nil, fmt.Errorf("objstore: list multipart uploads %s/%s: %w", c.cfg.Bucket, prefix, c.mapErr(err))
		}
		for _, u := range out.Uploads {
			ups = append(ups, PendingUpload{Key: aws.ToString(u.Key), UploadID: aws.ToString(u.UploadId)})
		}
		if !aws.ToBool(out.IsTruncated) {
			return ups, nil
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
	return ups, nil
}

// AbortIncompleteUploads aborts every incomplete multipart upload under
// prefix (the leftovers of failed attempts) and returns how many it
// aborted.
func (c *Client) AbortIncompleteUploads(ctx context.Context, prefix string) (int, error) {
	ups, err := c.ListIncompleteUploads(ctx, prefix)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, u := range ups {
		_, err := c.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
			Bucket: aws.String(c.cfg.Bucket), Key: aws.String(u.Key), UploadId: aws.String(u.UploadID),
		})
		if err != nil && !errors.Is(c.mapErr(err), ErrNotFound) {
			return n, fmt.Errorf("objstore: abort multipart upload %s of %s/%s: %w", u.UploadID, c.cfg.Bucket, u.Key, c.mapErr(err))
		}
		n++
		c.log.Info("aborted incomplete multipart upload", "key", u.Key, "upload_id", u.UploadID)
	}
	return n, nil
}

// EnsureBucket creates the bucket unless it exists.
func (c *Client) EnsureBucket(ctx context.Context) error {
	_, err := c.s3.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(c.cfg.Bucket)})
	if err == nil {
		return nil
	}
	if !errors.Is(c.mapErr(err), ErrNotFound) {
		return fmt.Errorf("objstore: head bucket %s: %w", c.cfg.Bucket, c.mapErr(err))
	}
	_, err = c.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(c.cfg.Bucket)})
	if err != nil {
		var owned *types.BucketAlreadyOwnedByYou
		if errors.As(err, &owned) {
			return nil
		}
		return fmt.Errorf("objstore: create bucket %s: %w", c.cfg.Bucket, c.mapErr(err))
	}
	c.log.Info("created bucket")
	return nil
}

// mapErr adds ErrNotFound to the chain of a not-found answer.
func (c *Client) mapErr(err error) error {
	if err == nil {
		return nil
	}
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var nsb *types.NoSuchBucket
	var nsu *types.NoSuchUpload
	notFound := errors.As(err, &nsk) || errors.As(err, &nf) || errors.As(err, &nsb) || errors.As(err, &nsu)
	if !notFound {
		var api smithy.APIError
		if errors.As(err, &api) {
			switch api.ErrorCode() {
			case "NoSuchKey", "NotFound", "NoSuchBucket", "NoSuchUpload":
				notFound = true
			}
		}
	}
	if !notFound {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
			notFound = true
		}
	}
	if notFound {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

func (c *Client) bucketMissing(err error) bool {
	var nsb *types.NoSuchBucket
	return errors.As(err, &nsb) || hasCode(err, "NoSuchBucket")
}

// hasCode reports whether err is an S3 API error with the given code.
func hasCode(err error, code string) bool {
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == code
}
