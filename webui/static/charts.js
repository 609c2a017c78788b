/* Two small SVG charts, drawn without a library: a line over time and labelled bars.
 * Labels are set with textContent, so checkpoint ids never become markup. */
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

  function yAxis(root, lo, hi, y, ticks = 4) {
    for (let i = 0; i <= ticks; i++) {
      const v = lo + (hi - lo) * i / ticks;
      const py = y(v);
      root.append(svg("line", {x1: PAD.left, x2: W - PAD.right, y1: py, y2: py, class: "grid"}));
      root.append(svg("text", {x: PAD.left - 6, y: py + 4, class: "tick", "text-anchor": "end"},
                      Number.isInteger(v) ? String(v) : v.toFixed(2)));
    }
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

  return {line, bars, valueRange};
})();
