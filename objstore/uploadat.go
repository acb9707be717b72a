package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// maxUploadParts is S3's limit on the parts of one multipart upload.
const maxUploadParts = 10000

// UploadAt writes the size bytes of body to key as Upload does — a single
// PUT up to PartSize, otherwise a multipart upload of PartSize parts sent
// Concurrency at a time, every request with a CRC32C checksum that S3
// verifies, a failed upload aborted and cleaned up — but without copying the
// bytes: each request's body is an io.SectionReader of body, which the SDK
// reads where it lies to sign, checksum and send it, and reads again when it
// retries a request. The transfer manager behind Upload copies every byte
// into a pool of part buffers it allocates per object; for many objects laid
// out over records already in memory (AutoMQ's failover writes an object per
// stream over the WAL's records) that copy and those pools cost more CPU
// than the rest of the upload.
//
// body must hold size bytes and must not change until UploadAt returns.
// The result's CRC32C is 0: UploadAt does not read the body as a whole (S3
// checks every part's CRC32C). progress is as for Upload.
func (c *Client) UploadAt(ctx context.Context, key string, body io.ReaderAt, size int64, progress func(done int64)) (UploadResult, error) {
	if size < 0 {
		return UploadResult{}, fmt.Errorf("objstore: upload %s: negative size %d", key, size)
	}
	start := time.Now()
	partSize := c.opts.PartSize
	if size/partSize >= maxUploadParts {
		partSize = size/maxUploadParts + 1
	}
	res := UploadResult{Key: key, Size: size, Parts: 1}
	if size <= partSize {
		out, err := c.s3.PutObject(ctx, &s3.PutObjectInput{
			Bucket:            aws.String(c.cfg.Bucket),
			Key:               aws.String(key),
			Body:              io.NewSectionReader(body, 0, size),
			ContentLength:     aws.Int64(size),
			ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		})
		if err != nil {
			return UploadResult{}, fmt.Errorf("objstore: upload %s/%s: %w", c.cfg.Bucket, key, c.mapErr(err))
		}
		if progress != nil {
			progress(size)
		}
		res.ETag, res.ChecksumCRC32C = aws.ToString(out.ETag), aws.ToString(out.ChecksumCRC32C)
		c.log.Debug("uploaded object", "key", key, "bytes", size, "parts", 1, "elapsed", time.Since(start))
		return res, nil
	}
	create, err := c.s3.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket:            aws.String(c.cfg.Bucket),
		Key:               aws.String(key),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
	})
	if err != nil {
		return UploadResult{}, fmt.Errorf("objstore: upload %s/%s: start the multipart upload: %w", c.cfg.Bucket, key, c.mapErr(err))
	}
	id := aws.ToString(create.UploadId)
	parts, err := c.uploadParts(ctx, key, id, body, size, partSize, progress)
	if err == nil {
		var out *s3.CompleteMultipartUploadOutput
		out, err = c.s3.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket:          aws.String(c.cfg.Bucket),
			Key:             aws.String(key),
			UploadId:        aws.String(id),
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
			MpuObjectSize:   aws.Int64(size),
		})
		if err == nil {
			res.ETag, res.ChecksumCRC32C, res.Parts = aws.ToString(out.ETag), aws.ToString(out.ChecksumCRC32C), len(parts)
			c.log.Debug("uploaded object", "key", key, "bytes", size, "parts", len(parts), "elapsed", time.Since(start))
			return res, nil
		}
	}
	// Abort first, then make sure the upload is gone (cleanupUpload).
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	_, aerr := c.s3.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
		Bucket: aws.String(c.cfg.Bucket), Key: aws.String(key), UploadId: aws.String(id),
	})
	cancel()
	if aerr != nil && !errors.Is(c.mapErr(aerr), ErrNotFound) {
		c.log.Warn("abort failed multipart upload", "key", key, "upload_id", id, "err", aerr)
	}
	c.cleanupUpload(ctx, key, id)
	return UploadResult{}, fmt.Errorf("objstore: upload %s/%s: %w", c.cfg.Bucket, key, c.mapErr(err))
}

// uploadParts sends the parts of upload id, Concurrency at a time, and
// returns them in order. The first failure stops the others.
func (c *Client) uploadParts(ctx context.Context, key, id string, body io.ReaderAt, size, partSize int64, progress func(int64)) ([]types.CompletedPart, error) {
	n := int((size + partSize - 1) / partSize)
	parts := make([]types.CompletedPart, n)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		mu      sync.Mutex
		done    int64
		errOnce sync.Once
		first   error
	)
	fail := func(err error) {
		errOnce.Do(func() { first = err })
		cancel(err)
	}
	workers := min(max(c.opts.Concurrency, 1), n)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				off := int64(i) * partSize
				l := min(partSize, size-off)
				out, err := c.s3.UploadPart(ctx, &s3.UploadPartInput{
					Bucket:            aws.String(c.cfg.Bucket),
					Key:               aws.String(key),
					UploadId:          aws.String(id),
					PartNumber:        aws.Int32(int32(i + 1)),
					Body:              io.NewSectionReader(body, off, l),
					ContentLength:     aws.Int64(l),
					ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
				})
				if err != nil {
					fail(fmt.Errorf("part %d of %d: %w", i+1, n, err))
					return
				}
				parts[i] = types.CompletedPart{PartNumber: aws.Int32(int32(i + 1)), ETag: out.ETag, ChecksumCRC32C: out.ChecksumCRC32C}
				if progress != nil {
					mu.Lock()
					done += l
					progress(done)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return parts, nil
}
