package devcontroller

import "strconv"

// Code is an error code of the Kafka protocol as AutoMQ's controller answers
// it: 0 for success, Kafka's own codes (41 NOT_CONTROLLER...) and AutoMQ's
// range 501–599.
type Code int16

// The codes the development controller answers. The numbers are Kafka's
// Errors enum in AutoMQ 1.4.1; the names are its constants'.
const (
	None                     Code = 0
	UnknownServerError       Code = -1
	UnsupportedVersion       Code = 35
	UnsupportedSASLMechanism Code = 33
	IllegalSASLState         Code = 34
	NotController            Code = 41
	InvalidRequest           Code = 42
	SASLAuthenticationFailed Code = 58
	StreamExist              Code = 501
	StreamNotExist           Code = 502
	StreamFenced             Code = 503
	ObjectNotExist           Code = 504
	StreamNotOpened          Code = 505
	StreamNotClosed          Code = 506
	RedundantOperation       Code = 507
	CompactedObjectsNotFound Code = 508
	OffsetNotMatched         Code = 509
	NodeEpochExpired         Code = 510
	NodeEpochNotExist        Code = 511
	KeyExist                 Code = 512
	KeyNotExist              Code = 513
	NodeFenced               Code = 514
	NodeLocked               Code = 515
	ObjectNotCommitted       Code = 516
	StreamInnerError         Code = 599
)

var codeNames = map[Code]string{
	None:                     "NONE",
	UnknownServerError:       "UNKNOWN_SERVER_ERROR",
	UnsupportedVersion:       "UNSUPPORTED_VERSION",
	UnsupportedSASLMechanism: "UNSUPPORTED_SASL_MECHANISM",
	IllegalSASLState:         "ILLEGAL_SASL_STATE",
	NotController:            "NOT_CONTROLLER",
	InvalidRequest:           "INVALID_REQUEST",
	SASLAuthenticationFailed: "SASL_AUTHENTICATION_FAILED",
	StreamExist:              "STREAM_EXIST",
	StreamNotExist:           "STREAM_NOT_EXIST",
	StreamFenced:             "STREAM_FENCED",
	ObjectNotExist:           "OBJECT_NOT_EXIST",
	StreamNotOpened:          "STREAM_NOT_OPENED",
	StreamNotClosed:          "STREAM_NOT_CLOSED",
	RedundantOperation:       "REDUNDANT_OPERATION",
	CompactedObjectsNotFound: "COMPACTED_OBJECTS_NOT_FOUND",
	OffsetNotMatched:         "OFFSET_NOT_MATCHED",
	NodeEpochExpired:         "NODE_EPOCH_EXPIRED",
	NodeEpochNotExist:        "NODE_EPOCH_NOT_EXIST",
	KeyExist:                 "KEY_EXIST",
	KeyNotExist:              "KEY_NOT_EXIST",
	NodeFenced:               "NODE_FENCED",
	NodeLocked:               "NODE_LOCKED",
	ObjectNotCommitted:       "OBJECT_NOT_COMMITED",
	StreamInnerError:         "STREAM_INNER_ERROR",
}

// String returns the code's name as AutoMQ spells it (OBJECT_NOT_COMMITED
// included), or the number for a code this package does not name.
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "CODE_" + strconv.Itoa(int(c))
}
