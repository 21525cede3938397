package daemon

import "github.com/berth-dev/berth/internal/template"

// Layers is the daemon's layer store (cluster mode's node serves and
// imports layers by digest through it).
func (d *Daemon) Layers() *template.Store { return d.templates }
