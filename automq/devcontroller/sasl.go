package devcontroller

import (
	"bytes"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"strings"
)

// The SASL mechanisms the development controller accepts, as Kafka names
// them.
const (
	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// Sentinel errors of SASL.
var (
	// ErrAuthentication: a client's credentials or SASL exchange were
	// refused. The connection is closed after the answer.
	ErrAuthentication = errors.New("authentication failed")
	// ErrInvalidSASL: the SASL configuration is unusable.
	ErrInvalidSASL = errors.New("invalid sasl configuration")
)

// SASLConfig turns SASL on for the controller listeners (SASL_PLAINTEXT, or
// SASL_SSL with TLS): every connection must authenticate with SaslHandshake
// v1 and SaslAuthenticate before any other request but ApiVersions.
type SASLConfig struct {
	// Mechanisms lists the accepted mechanisms; empty means all three.
	Mechanisms []string
	// Users maps each user name to its password.
	Users map[string]string
	// Iterations is SCRAM's PBKDF2 iteration count (4096 when 0, the
	// minimum Kafka and its clients accept).
	Iterations int
}

// SASLConfigError is an unusable SASL setting: Key names it (sasl.users,
// sasl.mechanisms, sasl.iterations).
type SASLConfigError struct {
	Key    string
	Reason string
}

func (e *SASLConfigError) Error() string { return e.Key + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalidSASL) true.
func (e *SASLConfigError) Is(target error) bool { return target == ErrInvalidSASL }

// Validate reports the first unusable setting as a *SASLConfigError.
func (c *SASLConfig) Validate() error {
	_, err := newSASLAuthenticator(c)
	return err
}

// scramCredential is what a SCRAM server stores per user (RFC 5802 §3):
// never the password.
type scramCredential struct {
	salt       []byte
	iterations int
	storedKey  []byte
	serverKey  []byte
}

// saslAuthenticator holds the accepted mechanisms and the derived
// credentials.
type saslAuthenticator struct {
	mechanisms []string
	plain      map[string]string
	scram      map[string]map[string]scramCredential // mechanism → user → credential
}

func scramHash(mechanism string) func() hash.Hash {
	switch mechanism {
	case MechanismSCRAMSHA256:
		return sha256.New
	case MechanismSCRAMSHA512:
		return sha512.New
	}
	return nil
}

// newSASLAuthenticator validates the configuration and derives each user's
// SCRAM credentials with a fresh random salt.
func newSASLAuthenticator(c *SASLConfig) (*saslAuthenticator, error) {
	if c == nil {
		return nil, nil
	}
	mechs := c.Mechanisms
	if len(mechs) == 0 {
		mechs = []string{MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512}
	}
	if len(c.Users) == 0 {
		return nil, &SASLConfigError{Key: "sasl.users", Reason: "no user is configured"}
	}
	iters := c.Iterations
	if iters == 0 {
		iters = 4096
	}
	if iters < 4096 {
		return nil, &SASLConfigError{Key: "sasl.iterations", Reason: fmt.Sprintf("%d is below 4096, which clients refuse", iters)}
	}
	a := &saslAuthenticator{mechanisms: slices.Clone(mechs), scram: make(map[string]map[string]scramCredential)}
	for _, m := range mechs {
		switch m {
		case MechanismPlain:
			a.plain = c.Users
		case MechanismSCRAMSHA256, MechanismSCRAMSHA512:
			creds := make(map[string]scramCredential, len(c.Users))
			for user, pass := range c.Users {
				cred, err := newSCRAMCredential(scramHash(m), pass, iters)
				if err != nil {
					return nil, fmt.Errorf("devcontroller: sasl user %q: %w", user, err)
				}
				creds[user] = cred
			}
			a.scram[m] = creds
		default:
			return nil, &SASLConfigError{Key: "sasl.mechanisms", Reason: fmt.Sprintf("%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", m)}
		}
	}
	for user, pass := range c.Users {
		if user == "" || pass == "" {
			return nil, &SASLConfigError{Key: "sasl.users", Reason: "user names and passwords must not be empty"}
		}
	}
	return a, nil
}

func newSCRAMCredential(h func() hash.Hash, password string, iterations int) (scramCredential, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return scramCredential{}, err
	}
	salted, err := pbkdf2.Key(h, password, salt, iterations, h().Size())
	if err != nil {
		return scramCredential{}, err
	}
	clientKey := hmacSum(h, salted, []byte("Client Key"))
	stored := h()
	stored.Write(clientKey)
	return scramCredential{
		salt:       salt,
		iterations: iterations,
		storedKey:  stored.Sum(nil),
		serverKey:  hmacSum(h, salted, []byte("Server Key")),
	}, nil
}

func hmacSum(h func() hash.Hash, key, msg []byte) []byte {
	m := hmac.New(h, key)
	m.Write(msg)
	return m.Sum(nil)
}

// saslSession is one connection's exchange for one mechanism.
type saslSession interface {
	// step takes the client's next message and returns the server's answer
	// and whether the client is now authenticated. An error ends the
	// exchange: its text is sent to the client.
	step(client []byte) (server []byte, done bool, err error)
	// user is the authenticated user once done.
	user() string
}

// start begins an exchange for mechanism, which the handshake accepted.
func (a *saslAuthenticator) start(mechanism string) saslSession {
	if mechanism == MechanismPlain {
		return &plainSession{users: a.plain}
	}
	return &scramSession{mechanism: mechanism, hash: scramHash(mechanism), creds: a.scram[mechanism]}
}

// accepts reports whether mechanism is enabled.
func (a *saslAuthenticator) accepts(mechanism string) bool {
	return slices.Contains(a.mechanisms, mechanism)
}

// plainSession is RFC 4616: one message "authzid NUL user NUL password".
type plainSession struct {
	users map[string]string
	name  string
}

func (p *plainSession) user() string { return p.name }

func (p *plainSession) step(client []byte) ([]byte, bool, error) {
	parts := bytes.Split(client, []byte{0})
	if len(parts) != 3 {
		return nil, false, fmt.Errorf("invalid PLAIN message: %w", ErrAuthentication)
	}
	zid, user, pass := string(parts[0]), string(parts[1]), parts[2]
	if zid != "" && zid != user {
		return nil, false, fmt.Errorf("authorization id %q differs from user name %q: %w", zid, user, ErrAuthentication)
	}
	want, ok := p.users[user]
	// Compare even for an unknown user so that timing does not tell users apart.
	match := subtle.ConstantTimeCompare(pass, []byte(want)) == 1
	if !ok || !match {
		return nil, false, fmt.Errorf("invalid credentials with SASL mechanism PLAIN: %w", ErrAuthentication)
	}
	p.name = user
	return nil, true, nil
}

// scramSession is the server side of RFC 5802 (SCRAM) without channel
// binding, as Kafka's ScramSaslServer speaks it: client-first →
// server-first, client-final → server-final.
type scramSession struct {
	mechanism string
	hash      func() hash.Hash
	creds     map[string]scramCredential

	stage           int
	name            string
	gs2Header       string
	clientFirstBare string
	serverFirst     string
	nonce           string
	cred            scramCredential
}

func (s *scramSession) user() string { return s.name }

func (s *scramSession) fail(format string, args ...any) ([]byte, bool, error) {
	return nil, false, fmt.Errorf(format+": %w", append(args, ErrAuthentication)...)
}

func (s *scramSession) step(client []byte) ([]byte, bool, error) {
	s.stage++
	switch s.stage {
	case 1:
		return s.clientFirst(string(client))
	case 2:
		return s.clientFinal(string(client))
	}
	return s.fail("%s exchange already finished", s.mechanism)
}

// clientFirst reads "n,[a=authzid],n=user,r=nonce" and answers
// "r=nonce+servernonce,s=salt,i=iterations".
func (s *scramSession) clientFirst(msg string) ([]byte, bool, error) {
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok || (flag != "n" && flag != "y") {
		return s.fail("%s: channel binding is not supported (gs2 flag %q)", s.mechanism, flag)
	}
	authzid, bare, ok := strings.Cut(rest, ",")
	if !ok {
		return s.fail("%s: malformed client-first message", s.mechanism)
	}
	s.gs2Header = flag + "," + authzid + ","
	s.clientFirstBare = bare
	attrs := strings.Split(bare, ",")
	if len(attrs) != 2 || !strings.HasPrefix(attrs[0], "n=") || !strings.HasPrefix(attrs[1], "r=") {
		return s.fail("%s: the client-first message must be n=USER,r=NONCE without extensions", s.mechanism)
	}
	user, err := unescapeSASLName(attrs[0][2:])
	if err != nil {
		return s.fail("%s: %v", s.mechanism, err)
	}
	if authzid != "" {
		zid, err := unescapeSASLName(strings.TrimPrefix(authzid, "a="))
		if err != nil || !strings.HasPrefix(authzid, "a=") || zid != user {
			return s.fail("%s: authorization id differs from user name %q", s.mechanism, user)
		}
	}
	clientNonce := attrs[1][2:]
	if clientNonce == "" || strings.ContainsAny(clientNonce, ",") {
		return s.fail("%s: empty or malformed client nonce", s.mechanism)
	}
	cred, ok := s.creds[user]
	if !ok {
		// Answer as for a known user (with a throw-away salt) so that the
		// exchange does not tell which users exist; it fails at the proof.
		cred, _ = newSCRAMCredential(s.hash, "", 4096)
		cred.storedKey = nil
	}
	s.name = user
	s.cred = cred
	serverNonce := make([]byte, 24)
	if _, err := rand.Read(serverNonce); err != nil {
		return nil, false, err
	}
	s.nonce = clientNonce + base64.RawStdEncoding.EncodeToString(serverNonce)
	s.serverFirst = "r=" + s.nonce + ",s=" + base64.StdEncoding.EncodeToString(cred.salt) + ",i=" + strconv.Itoa(cred.iterations)
	return []byte(s.serverFirst), false, nil
}

// clientFinal reads "c=binding,r=nonce,p=proof", checks the proof and
// answers "v=serversignature".
func (s *scramSession) clientFinal(msg string) ([]byte, bool, error) {
	withoutProof, proofAttr, ok := cutLast(msg, ",")
	if !ok || !strings.HasPrefix(proofAttr, "p=") {
		return s.fail("%s: the client-final message has no proof", s.mechanism)
	}
	attrs := strings.Split(withoutProof, ",")
	if len(attrs) != 2 || !strings.HasPrefix(attrs[0], "c=") || !strings.HasPrefix(attrs[1], "r=") {
		return s.fail("%s: the client-final message must be c=BINDING,r=NONCE,p=PROOF", s.mechanism)
	}
	binding, err := base64.StdEncoding.DecodeString(attrs[0][2:])
	if err != nil || string(binding) != s.gs2Header {
		return s.fail("%s: channel binding does not repeat the gs2 header", s.mechanism)
	}
	if attrs[1][2:] != s.nonce {
		return s.fail("%s: nonce mismatch", s.mechanism)
	}
	proof, err := base64.StdEncoding.DecodeString(proofAttr[2:])
	if err != nil || len(proof) != s.hash().Size() || s.cred.storedKey == nil {
		return s.fail("invalid credentials with SASL mechanism %s", s.mechanism)
	}
	authMessage := []byte(s.clientFirstBare + "," + s.serverFirst + "," + withoutProof)
	clientSignature := hmacSum(s.hash, s.cred.storedKey, authMessage)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ clientSignature[i]
	}
	h := s.hash()
	h.Write(clientKey)
	if subtle.ConstantTimeCompare(h.Sum(nil), s.cred.storedKey) != 1 {
		return s.fail("invalid credentials with SASL mechanism %s", s.mechanism)
	}
	serverSignature := hmacSum(s.hash, s.cred.serverKey, authMessage)
	return []byte("v=" + base64.StdEncoding.EncodeToString(serverSignature)), true, nil
}

// unescapeSASLName undoes RFC 5802's saslname escaping (=2C is ",", =3D is
// "="); any other "=" is an error.
func unescapeSASLName(s string) (string, error) {
	if !strings.Contains(s, "=") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case strings.HasPrefix(s[i:], "=2C"):
			b.WriteByte(',')
		case strings.HasPrefix(s[i:], "=3D"):
			b.WriteByte('=')
		default:
			return "", errors.New("malformed user name escape")
		}
		i += 2
	}
	return b.String(), nil
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}
