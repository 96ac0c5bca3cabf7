package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"
)

// plot writes a PNG of two panels against N (log scale): goodput relative
// to one writer, and round trips per success. A strategy has one color;
// solid lines are one process, dashed ones 4 processes. Drawn with the
// standard library alone (a 3x5 pixel font for the labels).
func plot(path string, res rmwResults, strategies []strategy, counts []int) error {
	const w, h = 1100, 520
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	colors := []color.RGBA{{31, 90, 200, 255}, {30, 150, 60, 255}, {210, 40, 40, 255}, {230, 140, 0, 255}, {120, 60, 160, 255}}
	panels := []struct {
		title string
		value func(topo, s string, n int) float64
	}{
		{"GOODPUT VS 1 WRITER", func(topo, s string, n int) float64 {
			return res[topo][s][n].goodput() / res[oneProc][s][counts[0]].goodput()
		}},
		{"ROUND TRIPS PER SUCCESS", func(topo, s string, n int) float64 { return res[topo][s][n].rtt() }},
	}
	for pi, p := range panels {
		x0, y0 := 70+pi*520, 40
		pw, ph := 420, 360
		top := 0.0
		for _, topo := range []string{oneProc, fourProcs} {
			for _, s := range strategies {
				for _, n := range counts {
					top = max(top, p.value(topo, s.name, n))
				}
			}
		}
		top = niceCeil(top)
		text(img, x0, y0-25, p.title, color.RGBA{0, 0, 0, 255})
		axis := color.RGBA{0, 0, 0, 255}
		grid := color.RGBA{225, 225, 225, 255}
		for i := range 5 {
			y := y0 + ph - ph*i/4
			line(img, x0, y, x0+pw, y, grid, 1, false)
			text(img, x0-8-len(label(top*float64(i)/4))*8, y-5, label(top*float64(i)/4), axis)
		}
		xOf := func(n int) int {
			span := math.Log2(float64(counts[len(counts)-1]) / float64(counts[0]))
			if span == 0 {
				return x0
			}
			return x0 + int(float64(pw)*math.Log2(float64(n)/float64(counts[0]))/span)
		}
		for _, n := range counts {
			x := xOf(n)
			line(img, x, y0, x, y0+ph, grid, 1, false)
			s := strconv.Itoa(n)
			text(img, x-len(s)*4, y0+ph+8, s, axis)
		}
		text(img, x0+pw/2-30, y0+ph+26, "WRITERS N", axis)
		line(img, x0, y0, x0, y0+ph, axis, 1, false)
		line(img, x0, y0+ph, x0+pw, y0+ph, axis, 1, false)
		for si, s := range strategies {
			for ti, topo := range []string{oneProc, fourProcs} {
				var px, py int
				for i, n := range counts {
					x := xOf(n)
					y := y0 + ph - int(float64(ph)*p.value(topo, s.name, n)/top)
					if i > 0 {
						line(img, px, py, x, y, colors[si%len(colors)], 3, ti == 1)
					}
					fill(img, image.Rect(x-3, y-3, x+4, y+4), colors[si%len(colors)])
					px, py = x, y
				}
			}
		}
	}
	// Legend.
	lx, ly := 70, h-50
	for si, s := range strategies {
		c := colors[si%len(colors)]
		line(img, lx, ly, lx+30, ly, c, 3, false)
		text(img, lx+38, ly-5, strings.ToUpper(s.name), color.RGBA{0, 0, 0, 255})
		lx += 50 + len(s.name)*8 + 20
	}
	line(img, lx, ly, lx+30, ly, color.RGBA{90, 90, 90, 255}, 3, false)
	text(img, lx+38, ly-5, "1 PROCESS", color.RGBA{0, 0, 0, 255})
	lx += 50 + 9*8 + 20
	line(img, lx, ly, lx+30, ly, color.RGBA{90, 90, 90, 255}, 3, true)
	text(img, lx+38, ly-5, "4 PROCESSES", color.RGBA{0, 0, 0, 255})

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func label(v float64) string {
	if v == math.Trunc(v) {
		return strconv.Itoa(int(v))
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// line draws a line of the given thickness (dashed: 8 on, 6 off).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, thick int, dashed bool) {
	dx, dy := x1-x0, y1-y0
	steps := max(abs(dx), abs(dy), 1)
	for i := 0; i <= steps; i++ {
		if dashed && i%14 >= 8 {
			continue
		}
		x := x0 + dx*i/steps
		y := y0 + dy*i/steps
		fill(img, image.Rect(x-thick/2, y-thick/2, x-thick/2+thick, y-thick/2+thick), c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// text draws s in the 3x5 font, each pixel scale x scale.
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	const scale = 2
	for _, r := range s {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		for row, bits := range g {
			for col, b := range bits {
				if b == '#' {
					fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
				}
			}
		}
		x += 4 * scale
	}
}

// glyphs is a 3x5 pixel font of what the labels use.
var glyphs = map[rune][5]string{
	' ': {"...", "...", "...", "...", "..."},
	'?': {"##.", "..#", ".#.", "...", ".#."},
	'.': {"...", "...", "...", "...", ".#."},
	'-': {"...", "...", "###", "...", "..."},
	'/': {"..#", "..#", ".#.", "#..", "#.."},
	'(': {".#.", "#..", "#..", "#..", ".#."},
	')': {".#.", "..#", "..#", "..#", ".#."},
	'0': {"###", "#.#", "#.#", "#.#", "###"},
	'1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"},
	'3': {"###", "..#", "###", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"},
	'5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"},
	'7': {"###", "..#", "..#", ".#.", ".#."},
	'8': {"###", "#.#", "###", "#.#", "###"},
	'9': {"###", "#.#", "###", "..#", "###"},
	'A': {".#.", "#.#", "###", "#.#", "#.#"},
	'B': {"##.", "#.#", "##.", "#.#", "##."},
	'C': {".##", "#..", "#..", "#..", ".##"},
	'D': {"##.", "#.#", "#.#", "#.#", "##."},
	'E': {"###", "#..", "##.", "#..", "###"},
	'F': {"###", "#..", "##.", "#..", "#.."},
	'G': {".##", "#..", "#.#", "#.#", ".##"},
	'H': {"#.#", "#.#", "###", "#.#", "#.#"},
	'I': {"###", ".#.", ".#.", ".#.", "###"},
	'J': {"..#", "..#", "..#", "#.#", ".#."},
	'K': {"#.#", "#.#", "##.", "#.#", "#.#"},
	'L': {"#..", "#..", "#..", "#..", "###"},
	'M': {"#.#", "###", "###", "#.#", "#.#"},
	'N': {"##.", "#.#", "#.#", "#.#", "#.#"},
	'O': {".#.", "#.#", "#.#", "#.#", ".#."},
	'P': {"##.", "#.#", "##.", "#..", "#.."},
	'Q': {".#.", "#.#", "#.#", "##.", ".##"},
	'R': {"##.", "#.#", "##.", "#.#", "#.#"},
	'S': {".##", "#..", ".#.", "..#", "##."},
	'T': {"###", ".#.", ".#.", ".#.", ".#."},
	'U': {"#.#", "#.#", "#.#", "#.#", "###"},
	'V': {"#.#", "#.#", "#.#", "#.#", ".#."},
	'W': {"#.#", "#.#", "###", "###", "#.#"},
	'X': {"#.#", "#.#", ".#.", "#.#", "#.#"},
	'Y': {"#.#", "#.#", ".#.", ".#.", ".#."},
	'Z': {"###", "..#", ".#.", "#..", "###"},
}
