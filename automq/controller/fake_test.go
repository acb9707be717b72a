package controller_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"walden/automq/protocol"
	"walden/internal/testutil"
)

// fakeController is a controller listener of the test's own on a port it
// bound: it answers ApiVersions, SASL (PLAIN and SCRAM, server side) and
// the six AutoMQ APIs through a handler, and can misbehave as a test asks
// (a standby, silence, garbage, a frame cut in the middle).
type fakeController struct {
	t    testing.TB
	ln   net.Listener
	addr string

	tls  *tls.Config // server side; nil for plaintext
	sasl *fakeSASL   // nil for none

	mu      sync.Mutex
	standby bool            // answer every AutoMQ request NOT_CONTROLLER
	apis    map[int16]int16 // AutoMQ keys and max versions advertised
	handler func(h protocol.RequestHeader, req kmsg.Request) reply
	seen    map[int16]int // AutoMQ requests received, per key
	conns   map[net.Conn]bool
	wg      sync.WaitGroup
}

// reply is what the fake does with one AutoMQ request.
type reply struct {
	resp  kmsg.Response // encoded normally
	raw   []byte        // written as the frame's body instead of resp
	hang  bool          // never answer (the connection stays open)
	cut   bool          // write half of resp's frame, then close
	close bool          // close the connection without a word
}

type fakeSASL struct {
	mechanism string // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	user      string
	pass      string
}

func newFake(t testing.TB, opts ...func(*fakeController)) *fakeController {
	t.Helper()
	f := &fakeController{
		t:     t,
		ln:    testutil.Listen(t, "127.0.0.1"),
		apis:  map[int16]int16{},
		seen:  map[int16]int{},
		conns: map[net.Conn]bool{},
	}
	for _, a := range protocol.APIs {
		f.apis[a.Key] = a.MaxVersion
	}
	f.addr = f.ln.Addr().String()
	for _, o := range opts {
		o(f)
	}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(f.stop)
	return f
}

func (f *fakeController) stop() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakeController) setHandler(h func(protocol.RequestHeader, kmsg.Request) reply) {
	f.mu.Lock()
	f.handler = h
	f.mu.Unlock()
}

func (f *fakeController) setStandby(s bool) {
	f.mu.Lock()
	f.standby = s
	f.mu.Unlock()
}

func (f *fakeController) count(key int16) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[key]
}

func (f *fakeController) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if f.tls != nil {
			c = tls.Server(c, f.tls)
		}
		f.mu.Lock()
		f.conns[c] = true
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() {
				_ = c.Close()
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
			}()
			f.serveConn(c)
		}()
	}
}

// serveConn answers one connection's requests in order until it fails.
func (f *fakeController) serveConn(c net.Conn) {
	authed := f.sasl == nil
	var scram *scramServer
	for {
		frame, err := protocol.ReadFrame(c, protocol.DefaultMaxFrameSize)
		if err != nil {
			return
		}
		h, req, err := protocol.ParseRequest(frame)
		if err != nil {
			if h.APIKey == protocol.KeyApiVersions && errors.Is(err, protocol.ErrVersion) {
				// As Kafka does: v0 with UNSUPPORTED_VERSION and the keys.
				r := f.apiVersions(0)
				r.ErrorCode = kerr.UnsupportedVersion.Code
				f.write(c, h.CorrelationID, r)
				continue
			}
			return
		}
		switch r := req.(type) {
		case *kmsg.ApiVersionsRequest:
			f.write(c, h.CorrelationID, f.apiVersions(r.Version))
			continue
		case *kmsg.SASLHandshakeRequest:
			resp := &kmsg.SASLHandshakeResponse{Version: r.Version, SupportedMechanisms: []string{f.sasl.mechanism}}
			if r.Mechanism != f.sasl.mechanism {
				resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
			}
			f.write(c, h.CorrelationID, resp)
			continue
		case *kmsg.SASLAuthenticateRequest:
			resp := &kmsg.SASLAuthenticateResponse{Version: r.Version}
			var out []byte
			var done bool
			var err error
			if f.sasl.mechanism == "PLAIN" {
				done, err = true, f.sasl.plain(r.SASLAuthBytes)
			} else {
				if scram == nil {
					scram = &scramServer{cfg: f.sasl}
				}
				out, done, err = scram.step(r.SASLAuthBytes)
			}
			if err != nil {
				resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
				msg := err.Error()
				resp.ErrorMessage = &msg
			}
			resp.SASLAuthBytes = out
			f.write(c, h.CorrelationID, resp)
			if err != nil {
				return
			}
			authed = done
			continue
		}
		if _, ok := protocol.LookupAPI(h.APIKey); !ok || !authed {
			return
		}
		f.mu.Lock()
		f.seen[h.APIKey]++
		standby, handler := f.standby, f.handler
		f.mu.Unlock()
		var rep reply
		switch {
		case standby:
			rep.resp = errorResponse(req, kerr.NotController.Code)
		case handler != nil:
			rep = handler(h, req)
		default:
			f.t.Errorf("fake controller: no handler for %s", protocol.NameForKey(h.APIKey))
			return
		}
		switch {
		case rep.hang:
			_, _ = io.Copy(io.Discard, c) // until the client gives up
			return
		case rep.close:
			return
		case rep.raw != nil:
			out := make([]byte, 4, 9+len(rep.raw))
			out = append(out, byte(h.CorrelationID>>24), byte(h.CorrelationID>>16), byte(h.CorrelationID>>8), byte(h.CorrelationID), 0)
			out = append(out, rep.raw...)
			out[0], out[1], out[2], out[3] = byte((len(out)-4)>>24), byte((len(out)-4)>>16), byte((len(out)-4)>>8), byte(len(out)-4)
			if _, err := c.Write(out); err != nil {
				return
			}
		case rep.cut:
			out, err := protocol.AppendResponse(nil, h.CorrelationID, rep.resp)
			if err != nil {
				f.t.Errorf("fake controller: %v", err)
				return
			}
			_, _ = c.Write(out[:len(out)/2])
			return
		default:
			rep.resp.SetVersion(h.APIVersion)
			f.write(c, h.CorrelationID, rep.resp)
		}
	}
}

func (f *fakeController) write(c net.Conn, corr int32, resp kmsg.Response) {
	out, err := protocol.AppendResponse(nil, corr, resp)
	if err != nil {
		f.t.Errorf("fake controller: encode %T: %v", resp, err)
		return
	}
	_, _ = c.Write(out)
}

func (f *fakeController) apiVersions(v int16) *kmsg.ApiVersionsResponse {
	r := kmsg.NewPtrApiVersionsResponse()
	r.Version = v
	keys := []kmsg.ApiVersionsResponseApiKey{{ApiKey: protocol.KeyApiVersions, MaxVersion: 4}}
	if f.sasl != nil {
		keys = append(keys, kmsg.ApiVersionsResponseApiKey{ApiKey: 17, MaxVersion: 1}, kmsg.ApiVersionsResponseApiKey{ApiKey: 36, MaxVersion: 2})
	}
	f.mu.Lock()
	for _, a := range protocol.APIs {
		if max, ok := f.apis[a.Key]; ok {
			keys = append(keys, kmsg.ApiVersionsResponseApiKey{ApiKey: a.Key, MaxVersion: max})
		}
	}
	f.mu.Unlock()
	r.ApiKeys = keys
	return r
}

// errorResponse is req's response with a top-level error code.
func errorResponse(req kmsg.Request, code int16) kmsg.Response {
	resp := req.ResponseKind()
	switch r := resp.(type) {
	case *protocol.OpenStreamsResponse:
		r.ErrorCode = code
	case *protocol.CloseStreamsResponse:
		r.ErrorCode = code
	case *protocol.PrepareS3ObjectResponse:
		r.ErrorCode = code
	case *protocol.CommitStreamSetObjectResponse:
		r.ErrorCode = code
	case *protocol.GetOpeningStreamsResponse:
		r.ErrorCode = code
	case *protocol.AutomqGetNodesResponse:
		r.ErrorCode = code
	}
	return resp
}

func (s *fakeSASL) plain(b []byte) error {
	parts := bytes.Split(b, []byte{0})
	if len(parts) != 3 || string(parts[1]) != s.user || string(parts[2]) != s.pass {
		return errors.New("invalid username or password")
	}
	return nil
}

// scramServer is the server side of SCRAM (RFC 5802): two exchanges.
type scramServer struct {
	cfg             *fakeSASL
	clientFirstBare string
	serverFirst     string
	nonce           string
	salted          []byte
}

func (s *scramServer) hash() func() hash.Hash {
	if s.cfg.mechanism == "SCRAM-SHA-512" {
		return sha512.New
	}
	return sha256.New
}

func (s *scramServer) mac(key []byte, msg string) []byte {
	m := hmac.New(s.hash(), key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func (s *scramServer) step(in []byte) ([]byte, bool, error) {
	msg := string(in)
	if s.serverFirst == "" {
		// client-first: gs2 header "n,," then n=user,r=nonce.
		bare, ok := strings.CutPrefix(msg, "n,,")
		if !ok {
			return nil, false, fmt.Errorf("bad client-first %q", msg)
		}
		attrs := scramAttrs(bare)
		if attrs["n"] != s.cfg.user {
			return nil, false, errors.New("unknown user")
		}
		var salt, nonce [12]byte
		_, _ = rand.Read(salt[:])
		_, _ = rand.Read(nonce[:])
		s.clientFirstBare = bare
		s.nonce = attrs["r"] + base64.RawStdEncoding.EncodeToString(nonce[:])
		const iterations = 4096
		var err error
		s.salted, err = pbkdf2.Key(s.hash(), s.cfg.pass, salt[:], iterations, s.hash()().Size())
		if err != nil {
			return nil, false, err
		}
		s.serverFirst = "r=" + s.nonce + ",s=" + base64.StdEncoding.EncodeToString(salt[:]) + ",i=" + strconv.Itoa(iterations)
		return []byte(s.serverFirst), false, nil
	}
	// client-final: c=biws,r=nonce,p=proof.
	i := strings.LastIndex(msg, ",p=")
	if i < 0 {
		return nil, false, errors.New("no proof")
	}
	withoutProof := msg[:i]
	attrs := scramAttrs(msg)
	if attrs["r"] != s.nonce {
		return nil, false, errors.New("nonce mismatch")
	}
	proof, err := base64.StdEncoding.DecodeString(attrs["p"])
	if err != nil {
		return nil, false, err
	}
	authMsg := s.clientFirstBare + "," + s.serverFirst + "," + withoutProof
	clientKey := s.mac(s.salted, "Client Key")
	h := s.hash()()
	h.Write(clientKey)
	stored := h.Sum(nil)
	sig := s.mac(stored, authMsg)
	if len(proof) != len(sig) {
		return nil, false, errors.New("invalid proof")
	}
	recovered := make([]byte, len(sig))
	for j := range sig {
		recovered[j] = proof[j] ^ sig[j]
	}
	h = s.hash()()
	h.Write(recovered)
	if !hmac.Equal(h.Sum(nil), stored) {
		return nil, false, errors.New("invalid username or password")
	}
	serverSig := s.mac(s.mac(s.salted, "Server Key"), authMsg)
	return []byte("v=" + base64.StdEncoding.EncodeToString(serverSig)), true, nil
}

func scramAttrs(msg string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(msg, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}
