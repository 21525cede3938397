package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/berth-dev/berth/internal/errs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestErrorMappings pins every errs.Kind in each of the three E2B
// protocols: control-plane HTTP, envd REST HTTP and envd Connect codes.
func TestErrorMappings(t *testing.T) {
	type row struct {
		cp    int
		files int
		code  connect.Code
	}
	want := map[errs.Kind]row{
		errs.Internal:           {500, 500, connect.CodeInternal},
		errs.NotFound:           {404, 404, connect.CodeNotFound},
		errs.AlreadyExists:      {409, 409, connect.CodeAlreadyExists},
		errs.InvalidArgument:    {400, 400, connect.CodeInvalidArgument},
		errs.FailedPrecondition: {409, 400, connect.CodeFailedPrecondition},
		errs.Conflict:           {409, 409, connect.CodeAborted},
		errs.ResourceExhausted:  {429, 507, connect.CodeResourceExhausted},
		errs.PermissionDenied:   {403, 403, connect.CodePermissionDenied},
		errs.Unauthenticated:    {401, 401, connect.CodeUnauthenticated},
		errs.Unavailable:        {503, 502, connect.CodeUnavailable},
		errs.NotImplemented:     {501, 501, connect.CodeUnimplemented},
	}
	if len(want) != len(errs.Kinds()) {
		t.Fatalf("table covers %d kinds, errs has %d", len(want), len(errs.Kinds()))
	}
	for _, k := range errs.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			w, ok := want[k]
			if !ok {
				t.Fatalf("kind %s missing from the table", k)
			}
			got := row{controlPlaneStatus(k), filesStatus(k), connectCode(k)}
			if diff := cmp.Diff(w, got, cmp.AllowUnexported(row{})); diff != "" {
				t.Errorf("mapping (-want +got):\n%s", diff)
			}
			// Wrapped errors keep their kind across the boundary.
			err := fmt.Errorf("ctx: %w", errs.E(k, "boom"))
			if got := connect.CodeOf(connectError(err)); got != w.code {
				t.Errorf("connectError code = %v, want %v", got, w.code)
			}
		})
	}
	// Unclassified errors are internal everywhere.
	plain := errors.New("plain")
	if got := controlPlaneStatus(errs.KindOf(plain)); got != http.StatusInternalServerError {
		t.Errorf("plain error status = %d", got)
	}
	// A connect error passes through unchanged.
	ce := connect.NewError(connect.CodeDeadlineExceeded, plain)
	if got := connectError(ce); got != ce {
		t.Errorf("connect error was rewrapped: %v", got)
	}
}
