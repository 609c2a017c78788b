/* Small SVG charts, drawn without a library: a line over time, labelled bars, and rates
 * (0-100%) per round with a reference line. Labels are set with textContent, so checkpoint
 * ids never become markup. */
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 480, H = 220, PAD = {left: 44, right: 12, top: 12, bottom: 40};

  function svg(tag, attrs, label) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (label !== undefined) node.textContent = label;
    return node;
  }

  function frame(container, title) {
    const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", class: "chart-svg",
                             preserveAspectRatio: "xMidYMid meet"});
    root.append(svg("title", {}, title));
    container.replaceChildren(root);
    return root;
  }

  function empty(container, message) {
    const p = document.createElement("p");
    p.className = "muted chart-empty";
    p.textContent = message;
    container.replaceChildren(p);
  }

  function yAxis(root, lo, hi, y, ticks = 4, format = null) {
    for (let i = 0; i <= ticks; i++) {
      const v = lo + (hi - lo) * i / ticks;
      const py = y(v);
      root.append(svg("line", {x1: PAD.left, x2: W - PAD.right, y1: py, y2: py, class: "grid"}));
      root.append(svg("text", {x: PAD.left - 6, y: py + 4, class: "tick", "text-anchor": "end"},
                      format ? format(v) : Number.isInteger(v) ? String(v) : v.toFixed(2)));
    }
  }

  /** A series' marker: a circle, or a diamond (``shape: "diamond"``), filled unless hollow. */
  function marker(shape, cx, cy, r, cls) {
    if (shape === "diamond") {
      const d = r * 1.3;
      return svg("path", {d: `M${cx.toFixed(1)} ${(cy - d).toFixed(1)} l${d} ${d} l${-d} ${d} ` +
                             `l${-d} ${-d} z`, class: cls});
    }
    return svg("circle", {cx: cx.toFixed(1), cy: cy.toFixed(1), r, class: cls});
  }

  /** A legend's sample of a series: its marker (and line) in a small inline SVG. */
  function swatch(series, hollow = false) {
    const root = svg("svg", {viewBox: "0 0 28 14", width: 28, height: 14, class: "chart-svg swatch",
                             "aria-hidden": "true"});
    if (!hollow) root.append(svg("line", {x1: 1, x2: 27, y1: 7, y2: 7,
                                          class: `series ${series.className}`}));
    root.append(marker(series.shape, 14, 7, 4,
                       `mark ${series.className}${hollow ? " hollow" : ""}`));
    return root;
  }

  /** Rates in [0, 1] per slot (a round), drawn as percentages on a fixed 0-100% scale with
   * a dashed line at ``reference`` (the base: 50%). slots: [{label}] oldest first; series:
   * [{name, className, shape ("circle" | "diamond"), line (bool), points: [{slot, rate,
   * hollow, title}]}]. Each marker carries data-series (its className), data-slot and
   * data-percent, so a test (or a screen reader's user, through the title) can read it. */
  function rates(container, slots, series, title, {reference = 0.5, emptyMessage} = {}) {
    if (!slots.length || !series.some((s) => s.points.length)) {
      empty(container, emptyMessage || "Nothing measured yet.");
      return;
    }
    const root = frame(container, title);
    const inset = 16, left = PAD.left + inset, right = W - PAD.right - inset;
    const x = (i) => slots.length === 1 ? (left + right) / 2 :
      left + (right - left) * i / (slots.length - 1);
    const y = (v) => PAD.top + (H - PAD.top - PAD.bottom) * (1 - v);
    yAxis(root, 0, 1, y, 4, (v) => `${Math.round(v * 100)}%`);
    root.append(svg("line", {x1: PAD.left, x2: W - PAD.right, y1: y(reference),
                             y2: y(reference), class: "reference"}));
    root.append(svg("text", {x: W - PAD.right - 2, y: y(reference) - 5, class: "tick",
                             "text-anchor": "end"}, "as good as the base"));
    // round labels: every one when they fit, else evenly thinned (always the newest)
    const every = Math.max(1, Math.ceil(slots.length / 8));
    slots.forEach((slot, i) => {
      if ((slots.length - 1 - i) % every) return;
      const name = slot.label.length > 10 ? slot.label.slice(0, 9) + "…" : slot.label;
      root.append(svg("text", {x: x(i), y: H - 22, class: "tick", "text-anchor": "middle"}, name));
    });
    root.append(svg("text", {x: (PAD.left + W - PAD.right) / 2, y: H - 6,
                             class: "tick muted", "text-anchor": "middle"}, "round (checkpoint)"));
    // two series with a marker in one round sit side by side, so neither hides the other
    const taken = series.map((s) => new Set(s.points.map((p) => p.slot)));
    const shared = (slot) => taken.filter((t) => t.has(slot)).length > 1;
    series.forEach((s, k) => {
      const points = s.points.filter((p) => Number.isFinite(p.rate))
        .sort((a, b) => a.slot - b.slot);
      const px = (p) => x(p.slot) + (shared(p.slot) ? (k ? 5 : -5) : 0);
      if (s.line && points.length > 1) {
        root.append(svg("polyline", {class: `series ${s.className}`, fill: "none",
          points: points.map((p) => `${px(p).toFixed(1)},${y(p.rate).toFixed(1)}`).join(" ")}));
      }
      for (const p of points) {
        const mark = marker(s.shape, px(p), y(p.rate), 4.5,
                            `mark ${s.className}${p.hollow ? " hollow" : ""}`);
        mark.setAttribute("data-series", s.className);
        mark.setAttribute("data-slot", slots[p.slot].label);
        mark.setAttribute("data-percent", String(Math.round(p.rate * 100)));
        mark.append(svg("title", {}, p.title || `${s.name}, ${slots[p.slot].label}: ` +
                                             `${Math.round(p.rate * 100)}%`));
        root.append(mark);
      }
    });
  }

  /** The y range [lo, hi] of a line chart. It always holds ``floor`` (the reward scale,
   * [-1, 1]), so run-to-run noise of a few hundredths stays a few hundredths tall instead of
   * filling the chart; values beyond it widen it to the next half. Pure: tested directly. */
  function valueRange(values, floor = [-1, 1]) {
    const finite = values.filter((v) => Number.isFinite(v));
    let lo = Math.min(floor[0], ...finite), hi = Math.max(floor[1], ...finite);
    lo = Math.floor(lo * 2) / 2;
    hi = Math.ceil(hi * 2) / 2;
    if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
    return [lo, hi];
  }

  /** points: [{x: Date, y: number, label: string}] in time order. */
  function line(container, points, title) {
    if (!points.length) { empty(container, "No finished training runs yet."); return; }
    const root = frame(container, title);
    const [lo, hi] = valueRange(points.map((p) => p.y));
    const t0 = points[0].x.getTime(), t1 = points[points.length - 1].x.getTime();
    const x = (d) => points.length === 1 ? (PAD.left + W - PAD.right) / 2 :
      PAD.left + (W - PAD.left - PAD.right) * (d.getTime() - t0) / Math.max(t1 - t0, 1);
    const y = (v) => PAD.top + (H - PAD.top - PAD.bottom) * (1 - (v - lo) / (hi - lo));
    yAxis(root, lo, hi, y);
    root.append(svg("polyline", {class: "series", fill: "none",
      points: points.map((p) => `${x(p.x).toFixed(1)},${y(p.y).toFixed(1)}`).join(" ")}));
    for (const p of points) {
      const dot = svg("circle", {cx: x(p.x), cy: y(p.y), r: 3.5, class: "dot"});
      dot.append(svg("title", {}, `${p.label}: ${p.y.toFixed(3)}`));
      root.append(dot);
    }
    const fmt = (d) => d.toLocaleDateString(undefined, {month: "short", day: "numeric"}) + " " +
      d.toLocaleTimeString(undefined, {hour: "2-digit", minute: "2-digit"});
    root.append(svg("text", {x: PAD.left, y: H - 12, class: "tick"}, fmt(points[0].x)));
    if (points.length > 1) {
      root.append(svg("text", {x: W - PAD.right, y: H - 12, class: "tick", "text-anchor": "end"},
                      fmt(points[points.length - 1].x)));
    }
  }

  /** bars: [{label, value, note}], value on a fixed 0..max scale. */
  function bars(container, items, max, title) {
    if (!items.length) { empty(container, "No rated replies yet."); return; }
    const root = frame(container, title);
    const y = (v) => PAD.top + (H - PAD.top - PAD.bottom) * (1 - v / max);
    // whole-number ticks on a 1-5 scale: 2.5 must not be labelled "3"
    yAxis(root, 0, max, y, Number.isInteger(max) && max <= 10 ? max : 4);
    const slot = (W - PAD.left - PAD.right) / items.length;
    const width = Math.min(48, slot * 0.7);
    items.forEach((item, i) => {
      const cx = PAD.left + slot * (i + 0.5);
      const bar = svg("rect", {x: cx - width / 2, y: y(item.value), width,
                               height: Math.max(y(0) - y(item.value), 0), class: "bar"});
      bar.append(svg("title", {}, `${item.label}: ${item.value.toFixed(2)} (${item.note})`));
      root.append(bar);
      root.append(svg("text", {x: cx, y: y(item.value) - 4, class: "tick", "text-anchor": "middle"},
                      item.value.toFixed(2)));
      const name = item.label.length > 10 ? item.label.slice(0, 9) + "…" : item.label;
      root.append(svg("text", {x: cx, y: H - 24, class: "tick", "text-anchor": "middle"}, name));
      root.append(svg("text", {x: cx, y: H - 10, class: "tick muted", "text-anchor": "middle"},
                      item.note));
    });
  }

  return {line, bars, rates, swatch, valueRange};
})();
