package devcontroller

import (
	"bufio"
	"errors"
	"io"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"walden/automq/protocol"
)

// maxFrame bounds a request frame: the largest request here is a commit
// listing a few thousand ranges.
const maxFrame = 16 << 20

// Kafka's keys the controller answers besides AutoMQ's.
const (
	keySaslHandshake    int16 = 17
	keyApiVersions      int16 = 18
	keySaslAuthenticate int16 = 36
)

// versionRange is one key's versions as ApiVersions lists them.
type versionRange struct{ key, min, max int16 }

// servedAPIs are the keys and versions every voter serves: ApiVersions
// v0–v3 and the six AutoMQ APIs at AutoMQ 1.4.1's versions.
func servedAPIs(withSASL bool) []versionRange {
	out := []versionRange{{keyApiVersions, 0, 3}}
	if withSASL {
		// SaslHandshake v1 only: v0 would mean unframed SASL tokens.
		out = append(out, versionRange{keySaslHandshake, 1, 1}, versionRange{keySaslAuthenticate, 0, 2})
	}
	for _, a := range protocol.APIs {
		out = append(out, versionRange{a.Key, a.MinVersion, a.MaxVersion})
	}
	return out
}

// connState is one connection's authentication.
type connState struct {
	remote        string
	authenticated bool
	mechanism     string
	session       saslSession
}

// serveConn reads requests from conn and answers them in order until the
// client goes, a request cannot be read, or a fault or a refusal closes it.
func (c *Controller) serveConn(v *voter, conn net.Conn) {
	cs := &connState{remote: conn.RemoteAddr().String(), authenticated: c.sasl == nil}
	r := bufio.NewReader(conn)
	for {
		frame, err := protocol.ReadFrame(r, maxFrame)
		if err != nil {
			if !errors.Is(err, io.EOF) && !c.isClosed() {
				c.log.Debug("connection ends", "voter", v.id, "remote", cs.remote, "err", err)
			}
			return
		}
		hdr, req, err := protocol.ParseRequest(frame)
		if err != nil {
			if hdr.APIKey == keyApiVersions && errors.Is(err, protocol.ErrVersion) {
				// A version above any this package decodes: answer as for v4+.
				if !c.write(conn, hdr.CorrelationID, unsupportedApiVersions()) {
					return
				}
				continue
			}
			c.log.Warn("closing a connection whose request cannot be read", "voter", v.id, "remote", cs.remote,
				"api_key", hdr.APIKey, "api_version", hdr.APIVersion, "err", err)
			return
		}
		if !c.serveRequest(v, conn, cs, hdr, req) {
			return
		}
	}
}

// serveRequest answers one request; false closes the connection.
func (c *Controller) serveRequest(v *voter, conn net.Conn, cs *connState, hdr protocol.RequestHeader, req kmsg.Request) bool {
	switch hdr.APIKey {
	case keyApiVersions:
		return c.write(conn, hdr.CorrelationID, c.apiVersions(req.(*kmsg.ApiVersionsRequest)))
	case keySaslHandshake:
		resp, keep := c.saslHandshake(cs, req.(*kmsg.SASLHandshakeRequest))
		return c.write(conn, hdr.CorrelationID, resp) && keep
	case keySaslAuthenticate:
		resp, keep := c.saslAuthenticate(v, cs, req.(*kmsg.SASLAuthenticateRequest))
		return c.write(conn, hdr.CorrelationID, resp) && keep
	}
	if !cs.authenticated {
		// Kafka closes a connection that sends anything else before it
		// has authenticated.
		c.log.Warn("closing a connection that sent a request before authenticating", "voter", v.id,
			"remote", cs.remote, "api", protocol.NameForKey(hdr.APIKey))
		return false
	}
	if !c.serves(hdr.APIKey, hdr.APIVersion) {
		c.log.Warn("closing a connection that sent an API or version this controller does not serve", "voter", v.id,
			"remote", cs.remote, "api_key", hdr.APIKey, "api_version", hdr.APIVersion)
		return false
	}

	fault, faulted := c.cfg.Faults.take(v.id, hdr.APIKey)
	if faulted {
		c.log.Info("injecting a fault", "voter", v.id, "api", protocol.NameForKey(hdr.APIKey), "fault", fault.Kind.String())
		switch fault.Kind {
		case FaultErrorCode:
			return c.write(conn, hdr.CorrelationID, errorResponse(req, fault.Code))
		case FaultGarbage:
			body := fault.Garbage
			if len(body) == 0 {
				body = []byte{0x7f}
			}
			return c.writeRaw(conn, appendRawFrame(nil, hdr.CorrelationID, body))
		}
	}
	resp := c.apply(v, req)
	if faulted {
		switch fault.Kind {
		case FaultDelay:
			t := time.NewTimer(fault.Delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-c.done:
				return false
			}
		case FaultCloseAfterApply:
			return false
		case FaultCutFrame:
			buf, err := protocol.AppendResponse(nil, hdr.CorrelationID, resp)
			if err != nil {
				c.log.Error("cannot encode a response", "api", protocol.NameForKey(hdr.APIKey), "err", err)
				return false
			}
			c.writeRaw(conn, buf[:len(buf)/2])
			return false
		}
	}
	return c.write(conn, hdr.CorrelationID, resp)
}

// String names a fault kind for logs.
func (k FaultKind) String() string {
	switch k {
	case FaultErrorCode:
		return "error_code"
	case FaultGarbage:
		return "garbage"
	case FaultCutFrame:
		return "cut_frame"
	case FaultDelay:
		return "delay"
	case FaultCloseAfterApply:
		return "close_after_apply"
	}
	return "unknown"
}

// serves reports whether key at version is one this controller answers.
func (c *Controller) serves(key, version int16) bool {
	for _, a := range servedAPIs(c.sasl != nil) {
		if a.key == key {
			return version >= a.min && version <= a.max
		}
	}
	return false
}

// isClosed reports whether Close was called.
func (c *Controller) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// write encodes resp in a frame and writes it; false when it cannot.
func (c *Controller) write(conn net.Conn, correlationID int32, resp kmsg.Response) bool {
	buf, err := protocol.AppendResponse(nil, correlationID, resp)
	if err != nil {
		c.log.Error("cannot encode a response", "api", protocol.NameForKey(resp.Key()), "err", err)
		return false
	}
	return c.writeRaw(conn, buf)
}

func (c *Controller) writeRaw(conn net.Conn, buf []byte) bool {
	_ = conn.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	if _, err := conn.Write(buf); err != nil {
		if !c.isClosed() {
			c.log.Debug("cannot write a response", "remote", conn.RemoteAddr().String(), "err", err)
		}
		return false
	}
	return true
}

// appendRawFrame frames a body that is not a message: the size, the
// correlation id and the bytes (a garbage answer).
func appendRawFrame(dst []byte, correlationID int32, body []byte) []byte {
	size := uint32(4 + len(body))
	dst = append(dst, byte(size>>24), byte(size>>16), byte(size>>8), byte(size))
	dst = append(dst, byte(correlationID>>24), byte(correlationID>>16), byte(correlationID>>8), byte(correlationID))
	return append(dst, body...)
}

// apiVersions answers ApiVersions: the served keys, or UNSUPPORTED_VERSION
// with ApiVersions' own range for a version above 3 (KIP-511), in v0 form.
func (c *Controller) apiVersions(req *kmsg.ApiVersionsRequest) kmsg.Response {
	if req.Version > 3 {
		return unsupportedApiVersions()
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = req.Version
	for _, a := range servedAPIs(c.sasl != nil) {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = a.key, a.min, a.max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	return resp
}

func unsupportedApiVersions() kmsg.Response {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	resp.ErrorCode = int16(UnsupportedVersion)
	k := kmsg.NewApiVersionsResponseApiKey()
	k.ApiKey, k.MinVersion, k.MaxVersion = keyApiVersions, 0, 3
	resp.ApiKeys = []kmsg.ApiVersionsResponseApiKey{k}
	return resp
}

// saslHandshake answers SaslHandshake v1: the mechanism must be enabled;
// false closes the connection after the answer.
func (c *Controller) saslHandshake(cs *connState, req *kmsg.SASLHandshakeRequest) (kmsg.Response, bool) {
	resp := kmsg.NewPtrSASLHandshakeResponse()
	resp.Version = req.Version
	switch {
	case c.sasl == nil:
		resp.ErrorCode = int16(IllegalSASLState)
		return resp, true
	case cs.authenticated || cs.session != nil:
		resp.ErrorCode = int16(IllegalSASLState)
		return resp, false
	}
	resp.SupportedMechanisms = append([]string(nil), c.sasl.mechanisms...)
	if !c.sasl.accepts(req.Mechanism) {
		c.log.Warn("refusing an unsupported SASL mechanism", "remote", cs.remote, "mechanism", req.Mechanism)
		resp.ErrorCode = int16(UnsupportedSASLMechanism)
		return resp, false
	}
	cs.mechanism = req.Mechanism
	cs.session = c.sasl.start(req.Mechanism)
	return resp, true
}

// saslAuthenticate answers one SaslAuthenticate round of the exchange the
// handshake began. A failed exchange answers SASL_AUTHENTICATION_FAILED
// with its reason and closes the connection, as Kafka does.
func (c *Controller) saslAuthenticate(v *voter, cs *connState, req *kmsg.SASLAuthenticateRequest) (kmsg.Response, bool) {
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	resp.Version = req.Version
	if cs.session == nil || cs.authenticated {
		msg := "SaslAuthenticate without a SaslHandshake before it"
		resp.ErrorCode, resp.ErrorMessage = int16(IllegalSASLState), &msg
		return resp, false
	}
	out, done, err := cs.session.step(req.SASLAuthBytes)
	if err != nil {
		msg := "Authentication failed: " + err.Error()
		resp.ErrorCode, resp.ErrorMessage = int16(SASLAuthenticationFailed), &msg
		c.log.Warn("SASL authentication failed", "voter", v.id, "remote", cs.remote, "mechanism", cs.mechanism, "err", err)
		return resp, false
	}
	resp.SASLAuthBytes = out
	if done {
		cs.authenticated = true
		c.log.Info("client authenticated", "voter", v.id, "remote", cs.remote, "mechanism", cs.mechanism, "user", cs.session.user())
		cs.session = nil
	}
	return resp, true
}

// errorResponse is the answer to req with code as its top-level error and
// nothing else, as Kafka's getErrorResponse builds it.
func errorResponse(req kmsg.Request, code Code) kmsg.Response {
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	e := int16(code)
	switch r := resp.(type) {
	case *protocol.OpenStreamsResponse:
		r.ErrorCode = e
	case *protocol.CloseStreamsResponse:
		r.ErrorCode = e
	case *protocol.PrepareS3ObjectResponse:
		r.ErrorCode = e
	case *protocol.CommitStreamSetObjectResponse:
		r.ErrorCode = e
	case *protocol.GetOpeningStreamsResponse:
		r.ErrorCode = e
	case *protocol.AutomqGetNodesResponse:
		r.ErrorCode = e
	}
	return resp
}
