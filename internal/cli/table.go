package cli

import (
	"bufio"
	"io"
	"text/tabwriter"
)

// tabWriter is a tabwriter whose output is buffered: text/tabwriter
// writes every cell and padding run with its own Write, i.e. one system
// call each on a terminal or pipe (a 1,000-row `berth ls`: 16,000).
type tabWriter struct {
	*tabwriter.Writer
	buf *bufio.Writer
}

func newTabWriter(w io.Writer, minwidth, tabwidth, padding int, padchar byte, flags uint) *tabWriter {
	buf := bufio.NewWriterSize(w, 32<<10)
	return &tabWriter{Writer: tabwriter.NewWriter(buf, minwidth, tabwidth, padding, padchar, flags), buf: buf}
}

// Flush writes the table out.
func (t *tabWriter) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	return t.buf.Flush()
}
