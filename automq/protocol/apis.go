package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// The API keys of AutoMQ's controller extension that walden speaks.
const (
	KeyOpenStreams           int16 = 502
	KeyCloseStreams          int16 = 503
	KeyPrepareS3Object       int16 = 505
	KeyCommitStreamSetObject int16 = 506
	KeyGetOpeningStreams     int16 = 508
	KeyAutomqGetNodes        int16 = 514
)

// KeyApiVersions is Kafka's ApiVersions, which kmsg implements; its
// responses always have header v0.
const KeyApiVersions int16 = 18

// API is one AutoMQ API: its key, its name and the versions AutoMQ 1.4.1
// has (all of them flexible).
type API struct {
	Key        int16
	Name       string
	MinVersion int16
	MaxVersion int16
}

// APIs lists the six AutoMQ APIs of this package in key order.
var APIs = []API{
	{KeyOpenStreams, "OpenStreams", 0, 1},
	{KeyCloseStreams, "CloseStreams", 0, 0},
	{KeyPrepareS3Object, "PrepareS3Object", 0, 0},
	{KeyCommitStreamSetObject, "CommitStreamSetObject", 0, 1},
	{KeyGetOpeningStreams, "GetOpeningStreams", 0, 0},
	{KeyAutomqGetNodes, "AutomqGetNodes", 0, 0},
}

// LookupAPI returns the AutoMQ API with the given key.
func LookupAPI(key int16) (API, bool) {
	for _, a := range APIs {
		if a.Key == key {
			return a, true
		}
	}
	return API{}, false
}

// NameForKey names an API key: the AutoMQ name for the six keys of this
// package, kmsg's for Kafka's keys, "Unknown" otherwise.
func NameForKey(key int16) string {
	if a, ok := LookupAPI(key); ok {
		return a.Name
	}
	return kmsg.NameForKey(key)
}

// NewRequest returns an empty request of the given key at version 0: this
// package's type for the six AutoMQ keys, kmsg's for Kafka's keys, nil for
// a key neither knows.
func NewRequest(key int16) kmsg.Request {
	switch key {
	case KeyOpenStreams:
		return new(OpenStreamsRequest)
	case KeyCloseStreams:
		return new(CloseStreamsRequest)
	case KeyPrepareS3Object:
		return new(PrepareS3ObjectRequest)
	case KeyCommitStreamSetObject:
		return new(CommitStreamSetObjectRequest)
	case KeyGetOpeningStreams:
		return new(GetOpeningStreamsRequest)
	case KeyAutomqGetNodes:
		return new(AutomqGetNodesRequest)
	}
	return kmsg.RequestForKey(key)
}

// NewResponse returns an empty response of the given key at version 0:
// this package's type for the six AutoMQ keys, kmsg's for Kafka's keys,
// nil for a key neither knows.
func NewResponse(key int16) kmsg.Response {
	switch key {
	case KeyOpenStreams:
		return new(OpenStreamsResponse)
	case KeyCloseStreams:
		return new(CloseStreamsResponse)
	case KeyPrepareS3Object:
		return new(PrepareS3ObjectResponse)
	case KeyCommitStreamSetObject:
		return new(CommitStreamSetObjectResponse)
	case KeyGetOpeningStreams:
		return new(GetOpeningStreamsResponse)
	case KeyAutomqGetNodes:
		return new(AutomqGetNodesResponse)
	}
	return kmsg.ResponseForKey(key)
}

// Message is what every request and response of this package is besides a
// kmsg.Request or kmsg.Response: a body that says whether it may be
// encoded at its version.
type Message interface {
	Key() int16
	GetVersion() int16
	SetVersion(int16)
	AppendTo([]byte) []byte
	ReadFrom([]byte) error
	// Validate reports why the message cannot be encoded at its version
	// (an EncodeError), or nil. AppendTo of a message that fails Validate
	// appends nothing, so that a peer refuses the frame rather than
	// receiving it with a value silently dropped; encode through
	// AppendRequest, AppendResponse or Encode to get the error instead.
	Validate() error
}

// Encode validates m and returns its body.
func Encode(m Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m.AppendTo(nil), nil
}

// Every message of the package is a kmsg request or response that kgo can
// send and read, and a Message.
var (
	_ kmsg.Request  = (*OpenStreamsRequest)(nil)
	_ kmsg.Request  = (*CloseStreamsRequest)(nil)
	_ kmsg.Request  = (*PrepareS3ObjectRequest)(nil)
	_ kmsg.Request  = (*CommitStreamSetObjectRequest)(nil)
	_ kmsg.Request  = (*GetOpeningStreamsRequest)(nil)
	_ kmsg.Request  = (*AutomqGetNodesRequest)(nil)
	_ kmsg.Response = (*OpenStreamsResponse)(nil)
	_ kmsg.Response = (*CloseStreamsResponse)(nil)
	_ kmsg.Response = (*PrepareS3ObjectResponse)(nil)
	_ kmsg.Response = (*CommitStreamSetObjectResponse)(nil)
	_ kmsg.Response = (*GetOpeningStreamsResponse)(nil)
	_ kmsg.Response = (*AutomqGetNodesResponse)(nil)

	_ Message = (*OpenStreamsRequest)(nil)
	_ Message = (*CloseStreamsRequest)(nil)
	_ Message = (*PrepareS3ObjectRequest)(nil)
	_ Message = (*CommitStreamSetObjectRequest)(nil)
	_ Message = (*GetOpeningStreamsRequest)(nil)
	_ Message = (*AutomqGetNodesRequest)(nil)
	_ Message = (*OpenStreamsResponse)(nil)
	_ Message = (*CloseStreamsResponse)(nil)
	_ Message = (*PrepareS3ObjectResponse)(nil)
	_ Message = (*CommitStreamSetObjectResponse)(nil)
	_ Message = (*GetOpeningStreamsResponse)(nil)
	_ Message = (*AutomqGetNodesResponse)(nil)
)
