package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/berth-dev/berth/internal/errs"
)

// MaxBody bounds every JSON request body read by Decode.
const MaxBody = 1 << 20

// Decode reads r's JSON body into v strictly: a field v does not have is an
// error naming it, and so is a value of the wrong type. An empty body leaves
// v as it is. The body is bounded by MaxBody; a larger one is refused, never
// truncated. Every error is InvalidArgument and names a field ("body" when
// the body as a whole is at fault).
func Decode(r *http.Request, v any) error {
	return decode(r.Body, v, true)
}

// DecodeLenient is Decode for protocols whose clients send fields berth
// does not know (the E2B SDKs): unknown fields are ignored; wrong types are
// still errors naming the field.
func DecodeLenient(r *http.Request, v any) error {
	return decode(r.Body, v, false)
}

// DecodeReader is Decode for a body that is not a request's.
func DecodeReader(rd io.Reader, v any) error {
	return decode(rd, v, true)
}

func decode(body io.Reader, v any, strict bool) error {
	if body == nil {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(body, MaxBody+1))
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, err, "read request body")
	}
	if len(b) > MaxBody {
		return errs.Field("body", "larger than %d bytes", MaxBody)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	return nil
}

// decodeError turns a json error into an InvalidArgument naming the field.
// A type that describes its JSON form (JSONForm, like duration.Duration)
// is named by that form rather than by its Go type.
func decodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" { // the body itself is not an object
			return errs.Field("body", "must be a JSON object, got %s", te.Value)
		}
		if f, ok := reflect.Zero(te.Type).Interface().(interface{ JSONForm() string }); ok {
			return errs.Field(te.Field, "must be a %s, got %s", f.JSONForm(), te.Value)
		}
		return errs.Field(te.Field, "must be a %s", te.Type)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if name := strings.Trim(f, `"`); name != "" {
			return errs.Field(name, "unknown field")
		}
		return errs.Field("body", "unknown field %s", f)
	}
	return errs.Field("body", "invalid JSON: %v", err)
}
