package e2b

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berth-dev/berth/api/gen/filesystem"
	"github.com/berth-dev/berth/internal/agentapi"
)

// filesystemService is envd's filesystem.Filesystem over the sandbox agent.
// Paths resolve in the agent (relative and "~" against the user's home).
type filesystemService struct {
	s *Server
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	e, err := targetFrom(ctx).agent.Stat(ctx, agentapi.PathRequest{Path: req.Msg.GetPath(), User: rpcUser(req.Header())})
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(e)}), nil
}

// MakeDir creates a directory and its parents; an existing one is
// already_exists (the SDK returns false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	e, err := targetFrom(ctx).agent.Mkdir(ctx, agentapi.PathRequest{Path: req.Msg.GetPath(), User: rpcUser(req.Header())})
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryInfo(e)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	e, err := targetFrom(ctx).agent.Move(ctx, agentapi.MoveRequest{
		Source: req.Msg.GetSource(), Destination: req.Msg.GetDestination(), User: rpcUser(req.Header()),
	})
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(e)}), nil
}

// ListDir lists to the requested depth (0 means 1).
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	depth := max(int(req.Msg.GetDepth()), 1)
	entries, err := targetFrom(ctx).agent.List(ctx, agentapi.ListRequest{Path: req.Msg.GetPath(), Depth: depth, User: rpcUser(req.Header())})
	if err != nil {
		return nil, connectError(err)
	}
	out := &filesystem.ListDirResponse{Entries: make([]*filesystem.EntryInfo, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, entryInfo(e))
	}
	return connect.NewResponse(out), nil
}

// Remove deletes recursively; a missing path is not an error.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	if err := targetFrom(ctx).agent.Remove(ctx, agentapi.PathRequest{Path: req.Msg.GetPath(), User: rpcUser(req.Header())}); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// WatchDir streams start, then filesystem events and idle keepalives, until
// the client's deadline (the SDK's timeoutMs) ends it with deadline_exceeded.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	ws, err := targetFrom(ctx).agent.Watch(ctx, agentapi.WatchRequest{
		Path: req.Msg.GetPath(), Recursive: req.Msg.GetRecursive(), User: rpcUser(req.Header()),
		IncludeEntry: req.Msg.GetIncludeEntry(), AllowNetworkMounts: req.Msg.GetAllowNetworkMounts(),
	}, keepaliveSec(req.Header()))
	if err != nil {
		return connectError(err)
	}
	defer ws.Close()
	for {
		ev, err := ws.Next()
		if err != nil {
			if ctxErr := streamCtxError(ctx); ctxErr != nil {
				return ctxErr
			}
			f.s.abortIfGone(ctx)
			if errors.Is(err, io.EOF) {
				return connect.NewError(connect.CodeUnavailable, errors.New("sandbox agent closed the watch stream"))
			}
			return connectError(err)
		}
		out := watchEvent(ev, req.Msg.GetIncludeEntry())
		if out == nil {
			continue
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// maxWatchName bounds the names and paths the agent may put in a watch event
// (PATH_MAX); an event beyond it is dropped, not forwarded.
const maxWatchName = 4096

// watchEvent translates one agent watch event; nil for unknown types and
// oversized events. The entry is forwarded only when it was asked for, and
// never for remove or rename (envd sends none: the entry is gone).
func watchEvent(ev agentapi.FSEvent, includeEntry bool) *filesystem.WatchDirResponse {
	if len(ev.Name) > maxWatchName || (ev.Entry != nil && (len(ev.Entry.Path) > maxWatchName ||
		len(ev.Entry.Name) > maxWatchName || len(ev.Entry.SymlinkTarget) > maxWatchName ||
		len(ev.Entry.Owner)+len(ev.Entry.Group)+len(ev.Entry.Permissions) > maxWatchName)) {
		return nil
	}
	var t filesystem.EventType
	switch ev.Type {
	case "start":
		return &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}
	case "keepalive":
		return &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}
	case "create":
		t = filesystem.EventType_EVENT_TYPE_CREATE
	case "write":
		t = filesystem.EventType_EVENT_TYPE_WRITE
	case "remove":
		t = filesystem.EventType_EVENT_TYPE_REMOVE
	case "rename":
		t = filesystem.EventType_EVENT_TYPE_RENAME
	case "chmod":
		t = filesystem.EventType_EVENT_TYPE_CHMOD
	default:
		return nil
	}
	fe := &filesystem.FilesystemEvent{Name: ev.Name, Type: t}
	if includeEntry && ev.Entry != nil && t != filesystem.EventType_EVENT_TYPE_REMOVE && t != filesystem.EventType_EVENT_TYPE_RENAME {
		fe.Entry = entryInfo(*ev.Entry)
	}
	return &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}
}

func (f *filesystemService) CreateWatcher(context.Context, *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("polling watchers are not supported; use WatchDir"))
}

func (f *filesystemService) GetWatcherEvents(context.Context, *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("polling watchers are not supported; use WatchDir"))
}

func (f *filesystemService) RemoveWatcher(context.Context, *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("polling watchers are not supported; use WatchDir"))
}

// entryInfo converts the agent's entry to envd's.
func entryInfo(e agentapi.EntryInfo) *filesystem.EntryInfo {
	out := &filesystem.EntryInfo{
		Name:         e.Name,
		Type:         fileType(e.Type),
		Path:         e.Path,
		Size:         e.Size,
		Mode:         e.Mode,
		Permissions:  e.Permissions,
		Owner:        e.Owner,
		Group:        e.Group,
		ModifiedTime: timestamppb.New(e.ModTime),
		Metadata:     e.Metadata,
	}
	if e.SymlinkTarget != "" {
		out.SymlinkTarget = &e.SymlinkTarget
	}
	return out
}

func fileType(t string) filesystem.FileType {
	switch t {
	case "file":
		return filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}
