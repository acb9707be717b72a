package objstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3afero"
	"github.com/spf13/afero"
)

// NewFakeHandler returns an S3-compatible HTTP handler (gofakes3) that keeps
// its buckets and objects under dir (created if missing), with the given
// buckets created. It accepts any credentials and is meant for development
// and tests only. Addressing is path-style.
func NewFakeHandler(dir string, logger *slog.Logger, buckets ...string) (http.Handler, error) {
	if dir == "" {
		return nil, fmt.Errorf("objstore: fake s3: --dir: required: %w", ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("objstore: fake s3: create %s: %w", dir, err)
	}
	backend, err := s3afero.MultiBucket(afero.NewBasePathFs(afero.NewOsFs(), dir))
	if err != nil {
		return nil, fmt.Errorf("objstore: fake s3: open %s: %w", dir, err)
	}
	for _, b := range buckets {
		err := backend.CreateBucket(b)
		if err != nil && !gofakes3.HasErrorCode(err, gofakes3.ErrBucketAlreadyExists) {
			return nil, fmt.Errorf("objstore: fake s3: create bucket %s: %w", b, err)
		}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	faker := gofakes3.New(backend,
		gofakes3.WithLogger(fakeLogger{logger}),
		gofakes3.WithTimeSkewLimit(0),
		gofakes3.WithoutVersioning(),
	)
	return faker.Server(), nil
}

type fakeLogger struct{ l *slog.Logger }

func (f fakeLogger) Print(level gofakes3.LogLevel, v ...any) {
	msg := fmt.Sprint(v...)
	switch level {
	case gofakes3.LogErr:
		f.l.Warn("fake s3", "msg", msg)
	default:
		f.l.Debug("fake s3", "level", string(level), "msg", msg)
	}
}

// FakeServer is a running embedded S3 server.
type FakeServer struct {
	// Endpoint is the server's URL, http://127.0.0.1:PORT.
	Endpoint string
	srv      *http.Server
	ln       net.Listener
	done     chan error
}

// ServeFake serves the fake S3 of dir (see NewFakeHandler) on addr until
// Close. An empty addr means 127.0.0.1:0 (a free loopback port).
func ServeFake(addr, dir string, logger *slog.Logger, buckets ...string) (*FakeServer, error) {
	h, err := NewFakeHandler(dir, logger, buckets...)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("objstore: fake s3: listen %s: %w", addr, err)
	}
	fs := &FakeServer{
		Endpoint: "http://" + ln.Addr().String(),
		srv:      &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		ln:       ln,
		done:     make(chan error, 1),
	}
	go func() { fs.done <- fs.srv.Serve(ln) }()
	return fs, nil
}

// Addr returns the address the server listens on.
func (f *FakeServer) Addr() net.Addr { return f.ln.Addr() }

// Close stops the server, waiting up to the context's deadline for requests
// in flight, then closing the rest.
func (f *FakeServer) Close(ctx context.Context) error {
	err := f.srv.Shutdown(ctx)
	if err != nil {
		_ = f.srv.Close()
	}
	if serr := <-f.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("objstore: fake s3: serve: %w", serr)
	}
	return err
}

// Kill closes the listener and every connection at once, as a crashed
// server would.
func (f *FakeServer) Kill() {
	_ = f.srv.Close()
	<-f.done
	f.done <- nil
}

// Fake credentials used with the embedded server; it accepts any.
const (
	FakeAccessKeyID     = "walden"
	FakeSecretAccessKey = "walden-secret"
)

// FakeConfig returns a Config for a fake (or other local) S3 endpoint:
// path-style addressing, region us-east-1, the fake credentials.
func FakeConfig(endpoint, bucket string) Config {
	return Config{
		Endpoint:        endpoint,
		Region:          "us-east-1",
		Bucket:          bucket,
		PathStyle:       true,
		AccessKeyID:     FakeAccessKeyID,
		SecretAccessKey: FakeSecretAccessKey,
	}
}
