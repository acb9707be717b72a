package protocol_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"walden/automq/protocol"
)

// vector is one frame of testdata/, AutoMQ 1.4.1's own bytes, and the
// values its .json says it holds.
type vector struct {
	name      string
	bin       []byte
	key       int16
	version   int16
	request   bool
	header    map[string]any
	body      json.RawMessage
	bodyMap   map[string]any
	codesUsed map[string]string
	meta      map[string]any
}

func loadVectors(t testing.TB) []vector {
	t.Helper()
	paths, err := filepath.Glob("testdata/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 18 {
		t.Fatalf("testdata holds %d vectors, want the 18 of AutoMQ 1.4.1 (9 APIs and versions, request and response)", len(paths))
	}
	var out []vector
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// Numbers stay json.Number: ids above 2^53 must not pass through float64.
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var meta map[string]any
		if err := dec.Decode(&meta); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		var parts struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			t.Fatal(err)
		}
		bin, err := os.ReadFile(strings.TrimSuffix(p, ".json") + ".bin")
		if err != nil {
			t.Fatal(err)
		}
		v := vector{
			name:    filepath.Base(strings.TrimSuffix(p, ".json")),
			bin:     bin,
			key:     int16(num(t, meta["api_key"])),
			version: int16(num(t, meta["api_version"])),
			request: meta["direction"] == "request",
			header:  meta["header"].(map[string]any),
			body:    parts.Body,
			bodyMap: meta["body"].(map[string]any),
			meta:    meta,
		}
		if hx, _ := meta["hex"].(string); hx != hex.EncodeToString(bin) {
			t.Fatalf("%s: the .json's hex is not the .bin", v.name)
		}
		if used, ok := meta["error_codes_used"].(map[string]any); ok {
			v.codesUsed = map[string]string{}
			for k, n := range used {
				v.codesUsed[k] = n.(string)
			}
		}
		out = append(out, v)
	}
	return out
}

func num(t testing.TB, v any) int64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v is not a number", v)
	}
	i, err := n.Int64()
	if err != nil {
		t.Fatalf("%v: %v", v, err)
	}
	return i
}

func mustFrame(t testing.TB, v vector) []byte {
	t.Helper()
	frame, err := protocol.ReadFrame(bytes.NewReader(v.bin), protocol.DefaultMaxFrameSize)
	if err != nil {
		t.Fatalf("%s: %v", v.name, err)
	}
	if int64(len(frame)) != num(t, v.meta["size_prefix"]) || len(v.bin) != int(num(t, v.meta["frame_length"])) {
		t.Fatalf("%s: frame of %d bytes, size prefix %v", v.name, len(frame), v.meta["size_prefix"])
	}
	return frame
}

// expectedBody builds the message the .json describes: for the AutoMQ APIs
// by decoding the JSON into this package's types (whose JSON names are
// Kafka's, and which refuse a JSON field they do not have), for ApiVersions
// field by field into kmsg's types.
func expectedBody(t *testing.T, v vector) any {
	t.Helper()
	if v.key == protocol.KeyApiVersions {
		return expectedApiVersions(t, v)
	}
	var m protocol.Message
	if v.request {
		m = protocol.NewRequest(v.key).(protocol.Message)
	} else {
		m = protocol.NewResponse(v.key).(protocol.Message)
	}
	m.SetVersion(v.version)
	dec := json.NewDecoder(bytes.NewReader(v.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		t.Fatalf("%s: the .json's body does not fit %T: %v", v.name, m, err)
	}
	return m
}

func expectedApiVersions(t *testing.T, v vector) any {
	b := v.bodyMap
	str := func(m map[string]any, k string) string { return m[k].(string) }
	i16 := func(m map[string]any, k string) int16 { return int16(num(t, m[k])) }
	list := func(k string) []map[string]any {
		var out []map[string]any
		for _, e := range b[k].([]any) {
			out = append(out, e.(map[string]any))
		}
		return out
	}
	if v.request {
		r := kmsg.NewPtrApiVersionsRequest()
		r.Version = v.version
		r.ClientSoftwareName = str(b, "clientSoftwareName")
		r.ClientSoftwareVersion = str(b, "clientSoftwareVersion")
		return r
	}
	r := kmsg.NewPtrApiVersionsResponse()
	r.Version = v.version
	r.ErrorCode = i16(b, "errorCode")
	r.ThrottleMillis = int32(num(t, b["throttleTimeMs"]))
	for _, k := range list("apiKeys") {
		r.ApiKeys = append(r.ApiKeys, kmsg.ApiVersionsResponseApiKey{
			ApiKey: i16(k, "apiKey"), MinVersion: i16(k, "minVersion"), MaxVersion: i16(k, "maxVersion")})
	}
	for _, f := range list("supportedFeatures") {
		r.SupportedFeatures = append(r.SupportedFeatures, kmsg.ApiVersionsResponseSupportedFeature{
			Name: str(f, "name"), MinVersion: i16(f, "minVersion"), MaxVersion: i16(f, "maxVersion")})
	}
	r.FinalizedFeaturesEpoch = num(t, b["finalizedFeaturesEpoch"])
	for _, f := range list("finalizedFeatures") {
		r.FinalizedFeatures = append(r.FinalizedFeatures, kmsg.ApiVersionsResponseFinalizedFeature{
			Name: str(f, "name"), MaxVersionLevel: i16(f, "maxVersionLevel"), MinVersionLevel: i16(f, "minVersionLevel")})
	}
	if len(b) != 6 {
		t.Fatalf("%s: the body has %d fields, the test reads 6", v.name, len(b))
	}
	return r
}

// TestVectors checks every frame of AutoMQ 1.4.1: it decodes to the
// .json's values, encodes back to the same bytes, and the frame built
// from the .json's values is the same bytes too.
func TestVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.name, func(t *testing.T) {
			frame := mustFrame(t, v)
			want := expectedBody(t, v)
			corr := int32(num(t, v.header["correlationId"]))
			if v.request {
				checkRequestVector(t, v, frame, corr, want.(kmsg.Request))
			} else {
				checkResponseVector(t, v, frame, corr, want.(kmsg.Response))
			}
			for code, name := range v.codesUsed {
				c, _ := strconv.Atoi(code)
				got := "NONE"
				if c != 0 {
					if e := protocol.LookupCode(int16(c)); e != nil {
						got = e.Name
					}
				}
				if got != name {
					t.Errorf("code %d is named %q here, %q in AutoMQ", c, got, name)
				}
			}
		})
	}
}

func checkRequestVector(t *testing.T, v vector, frame []byte, corr int32, want kmsg.Request) {
	hdr, got, err := protocol.ParseRequest(frame)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	clientID := v.header["clientId"].(string)
	if hdr.APIKey != v.key || hdr.APIVersion != v.version || hdr.CorrelationID != corr ||
		hdr.ClientID == nil || *hdr.ClientID != clientID || hdr.UnknownTags.Len() != 0 {
		t.Fatalf("header %+v, want key %d v%d correlation %d client %q", hdr, v.key, v.version, corr, clientID)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nthe .json says\n%+v", got, want)
	}
	if body := got.AppendTo(nil); len(body) != int(num(t, v.meta["body_length"])) {
		t.Fatalf("body of %d bytes, want %v", len(body), v.meta["body_length"])
	}
	again, err := protocol.AppendRequest(nil, corr, &clientID, got)
	if err != nil || !bytes.Equal(again, v.bin) {
		t.Fatalf("re-encoded (err %v)\n%x\nwant\n%x", err, again, v.bin)
	}
	built, err := protocol.AppendRequest(nil, corr, &clientID, want)
	if err != nil || !bytes.Equal(built, v.bin) {
		t.Fatalf("built from the .json (err %v)\n%x\nwant\n%x", err, built, v.bin)
	}
	// kgo writes request frames with kmsg's formatter: the same bytes.
	formatted := kmsg.NewRequestFormatter(kmsg.FormatterClientID(clientID)).AppendRequest(nil, want, corr)
	if !bytes.Equal(formatted, v.bin) {
		t.Fatalf("kmsg's formatter wrote\n%x\nwant\n%x", formatted, v.bin)
	}
}

func checkResponseVector(t *testing.T, v vector, frame []byte, corr int32, want kmsg.Response) {
	hdr, got, err := protocol.ParseResponse(frame, v.key, v.version)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if hdr.CorrelationID != corr || hdr.UnknownTags.Len() != 0 {
		t.Fatalf("header %+v, want correlation %d", hdr, corr)
	}
	wantHeaderLen := 5
	if v.key == protocol.KeyApiVersions {
		wantHeaderLen = 4 // ApiVersions keeps response header v0
	}
	if int(num(t, v.meta["header_length"])) != wantHeaderLen {
		t.Fatalf("the .json has a header of %v bytes, the test expects %d", v.meta["header_length"], wantHeaderLen)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nthe .json says\n%+v", got, want)
	}
	again, err := protocol.AppendResponse(nil, corr, got)
	if err != nil || !bytes.Equal(again, v.bin) {
		t.Fatalf("re-encoded (err %v)\n%x\nwant\n%x", err, again, v.bin)
	}
	built, err := protocol.AppendResponse(nil, corr, want)
	if err != nil || !bytes.Equal(built, v.bin) {
		t.Fatalf("built from the .json (err %v)\n%x\nwant\n%x", err, built, v.bin)
	}
}
