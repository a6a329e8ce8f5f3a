"use strict";
// Draws the vramshim report from the JSON embedded in the page (the documents the `--json`
// views print). Self-contained: no network, no library.
(function () {
  const data = JSON.parse(document.getElementById("vramshim-data").textContent);
  const root = document.getElementById("report");
  const SVG = "http://www.w3.org/2000/svg";
  const tip = el("div", { class: "tip" });
  // `report.html#search=TEXT` opens with TEXT searched in every flame graph.
  const initialSearch = location.hash.startsWith("#search=")
    ? decodeURIComponent(location.hash.slice("#search=".length)) : "";
  document.body.appendChild(tip);

  // --- helpers -----------------------------------------------------------------------------

  // An element with attributes and children (strings become text nodes).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(key, value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" || typeof child === "number"
        ? document.createTextNode(String(child)) : child);
    }
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    return node;
  }

  // Bytes in binary units, as the text views print them: 512 B, 1.50 KiB, 3.00 MiB.
  function bytes(n) {
    if (n === null || n === undefined) return "-";
    if (n < 1024) return n + " B";
    const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let value = n / 1024;
    let unit = 0;
    while (value >= 1024 && unit + 1 < units.length) {
      value /= 1024;
      unit += 1;
    }
    return value.toFixed(2) + " " + units[unit];
  }

  function seconds(ns) {
    return (ns / 1e9).toFixed(6) + "s";
  }

  function deviceName(device) {
    if (device === -1) return "pinned host memory";
    if (device === -2) return "unknown device";
    return "device " + device;
  }

  // A number cell holding the exact value in data-value and the readable one as text.
  function numCell(value, text) {
    return el("td", { class: "num", "data-value": value }, text === undefined ? String(value) : text);
  }

  function table(headers, rows, attrs) {
    return el("table", attrs || {},
      el("tr", {}, headers.map((h) => el("th", {}, h))),
      rows);
  }

  function isPython(frame) {
    return typeof frame.file === "string" && frame.file.endsWith(".py");
  }

  function framesList(frames, limit) {
    const shown = frames.slice(0, limit);
    const list = el("ol", { class: "frames" }, shown.map((f) => el("li", {}, f.label)));
    const more = frames.length - shown.length;
    if (more > 0) {
      list.appendChild(el("li", { class: "muted" }, more === 1 ? "1 more frame" : more + " more frames"));
    }
    return list;
  }

  function showTip(event, text) {
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = (event.clientX + 12) + "px";
    tip.style.top = (event.clientY + 12) + "px";
  }

  function hideTip() {
    tip.style.display = "none";
  }

  function section(id, title) {
    const node = el("section", { id: id }, el("h2", {}, title));
    root.appendChild(node);
    return node;
  }

  // --- summary -----------------------------------------------------------------------------

  function drawSummary() {
    const summary = data.summary;
    root.appendChild(el("h1", {}, "vramshim report"));
    root.appendChild(el("p", { class: "muted" },
      "logs: " + data.logs.join(", ") + " · vramshim " + data.version +
      " · duration " + seconds(summary.duration_ns)));
    root.appendChild(el("nav", {},
      [["summary", "Summary"], ["timelines", "Timelines"], ["flame-graphs", "Flame graphs"],
        ["top-stacks", "Top stacks"], ["oom", "OOM"], ["allocator", "Allocator"],
        ["whatif", "What if"]].map(([id, name]) => el("a", { href: "#" + id }, name))));
    if (data.warnings.length > 0) {
      root.appendChild(el("ul", { id: "warnings", class: "warn" },
        data.warnings.map((w) => el("li", {}, "warning: " + w))));
    }
    const node = section("summary", "Summary");
    node.appendChild(el("h3", {}, "Processes"));
    node.appendChild(table(["pid", "command", "duration", "events", "dropped", "log"],
      summary.processes.map((p) => el("tr", {},
        numCell(p.pid), el("td", {}, p.argv.join(" ")), numCell(p.duration_ns, seconds(p.duration_ns)),
        numCell(p.events), numCell(p.dropped_events), el("td", {}, p.log)))));
    node.appendChild(el("h3", {}, "Devices"));
    const devices = summary.devices.concat(summary.pinned_host ? [summary.pinned_host] : []);
    node.appendChild(table(
      ["device", "peak", "at", "live at peak", "live at end", "failed allocations", "highest used (sampled)"],
      devices.map((d) => {
        const high = d.memory_samples && d.memory_samples.highest_use;
        return el("tr", { "data-device": d.device },
          el("td", {}, deviceName(d.device)),
          numCell(d.peak_bytes, bytes(d.peak_bytes)),
          numCell(d.peak_t_ns, seconds(d.peak_t_ns)),
          numCell(d.peak_count, d.peak_count + (d.peak_count === 1 ? " allocation" : " allocations")),
          numCell(d.live_at_exit_bytes, bytes(d.live_at_exit_bytes) + " in " + d.live_at_exit_count),
          numCell(d.failures),
          high ? numCell(high.used, bytes(high.used) + " of " + bytes(high.total)) : el("td", { class: "muted" }, "no sample"));
      }), { id: "summary-devices" }));
    node.appendChild(el("h3", {}, "Calls by API family"));
    node.appendChild(table(["family", "allocations", "frees", "failures", "allocated"],
      summary.families.filter((f) => f.allocs + f.frees + f.failures > 0).map((f) => el("tr", {},
        el("td", {}, f.family), numCell(f.allocs), numCell(f.frees), numCell(f.failures),
        numCell(f.allocated_bytes, bytes(f.allocated_bytes))))));
    const marks = data.timeline.marks || [];
    if (marks.length) {
      node.appendChild(el("h3", {}, "Marks"));
      node.appendChild(table(["at", "mark", "pid", "thread"], marks.map((m) => el("tr", {},
        numCell(m.t_ns, seconds(m.t_ns)), el("td", {}, m.text), numCell(m.pid), numCell(m.thread))),
      { id: "marks" }));
    }
  }

  // --- timelines ---------------------------------------------------------------------------

  const COLORS = { live: "#2f6fb3", reserved: "#e07b00", used: "#1a7f37", failure: "#b3261e", peak: "#6f42c1", mark: "#444" };

  function drawTimelines() {
    const node = section("timelines", "Timelines");
    node.appendChild(el("p", { class: "muted" },
      "Mouse wheel: zoom around the pointer; drag: pan; double click: whole run."));
    const allocatorDevices = (data.allocator && data.allocator.devices) || [];
    for (const device of data.timeline.devices) {
      const reserved = allocatorDevices.find((d) => d.device === device.device);
      const marks = data.timeline.marks || [];
      node.appendChild(timelineChart(device, reserved ? reserved.reserved : null, marks));
    }
    if (data.timeline.devices.length === 0) node.appendChild(el("p", {}, "no device memory was allocated"));
  }

  function timelineChart(device, reserved, marks) {
    const end = Math.max(data.timeline.end_ns, 1);
    const width = 1100, height = 240, left = 70, right = 10, top = 10, bottom = 24;
    const plotW = width - left - right, plotH = height - top - bottom;
    const series = device.series || [];
    const used = device.used || [];
    const failures = device.failures || [];
    const reservedSeries = reserved ? reserved.series : [];
    let yMax = 1;
    for (const p of series) yMax = Math.max(yMax, p.max_bytes);
    for (const p of used) yMax = Math.max(yMax, p.bytes);
    for (const p of reservedSeries) yMax = Math.max(yMax, p.reserved);
    yMax *= 1.08;
    const view = { x0: 0, x1: end };

    const box = el("div", { class: "timeline", "data-device": device.device });
    box.appendChild(el("h3", {}, deviceName(device.device) + ": peak " +
      (device.peak ? bytes(device.peak.bytes) + " at " + seconds(device.peak.t_ns) : "none")));
    const legend = el("div", { class: "legend" },
      el("span", {}, el("i", { style: "background:" + COLORS.live }), "live allocations"),
      reservedSeries.length ? el("span", {}, el("i", { style: "background:" + COLORS.reserved }), "reserved (allocator view)") : null,
      used.length ? el("span", {}, el("i", { style: "background:" + COLORS.used }), "device used (sampled points)") : null,
      failures.length ? el("span", {}, el("i", { style: "background:" + COLORS.failure }), "failed allocation") : null,
      marks.length ? el("span", {}, el("i", { style: "background:" + COLORS.mark }), "marks") : null,
      device.total_bytes ? el("span", { class: "muted" }, "device memory " + bytes(device.total_bytes)) : null);
    box.appendChild(legend);
    const range = el("span", { class: "muted" });
    const controls = el("div", { class: "controls" },
      button("zoom in", () => zoom(0.5, (view.x0 + view.x1) / 2)),
      button("zoom out", () => zoom(2, (view.x0 + view.x1) / 2)),
      button("whole run", () => { view.x0 = 0; view.x1 = end; draw(); }),
      range);
    box.appendChild(controls);
    const svg = svgEl("svg", { class: "chart", width: width, height: height, viewBox: `0 0 ${width} ${height}` });
    box.appendChild(svg);

    function button(text, action) {
      const b = el("button", { type: "button" }, text);
      b.addEventListener("click", action);
      return b;
    }
    const x = (t) => left + (t - view.x0) / (view.x1 - view.x0) * plotW;
    const y = (b) => top + plotH - b / yMax * plotH;

    function zoom(factor, center) {
      const span = Math.max((view.x1 - view.x0) * factor, 1000);
      const ratio = (center - view.x0) / (view.x1 - view.x0);
      view.x0 = Math.max(0, center - ratio * span);
      view.x1 = Math.min(end, view.x0 + span);
      if (view.x1 - view.x0 < span) view.x0 = Math.max(0, view.x1 - span);
      draw();
    }

    function stepPath(points, time, value) {
      if (points.length === 0) return "";
      let d = `M${x(time(points[0])).toFixed(1)},${y(0).toFixed(1)}`;
      for (let i = 0; i < points.length; i++) {
        const px = x(time(points[i]));
        d += `H${px.toFixed(1)}V${y(value(points[i])).toFixed(1)}`;
      }
      return d + `H${x(end).toFixed(1)}`;
    }

    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const clipId = "clip-" + device.device;
      const defs = svgEl("defs");
      const clip = svgEl("clipPath", { id: clipId });
      clip.appendChild(svgEl("rect", { x: left, y: top, width: plotW, height: plotH }));
      defs.appendChild(clip);
      svg.appendChild(defs);
      for (let i = 0; i <= 4; i++) {
        const b = yMax * i / 4;
        svg.appendChild(svgEl("line", { x1: left, x2: left + plotW, y1: y(b), y2: y(b), stroke: "#eee" }));
        const label = svgEl("text", { x: left - 4, y: y(b) + 4, "text-anchor": "end" });
        label.textContent = bytes(Math.round(b));
        svg.appendChild(label);
      }
      for (let i = 0; i <= 5; i++) {
        const t = view.x0 + (view.x1 - view.x0) * i / 5;
        const label = svgEl("text", { x: x(t), y: height - 6, "text-anchor": i === 0 ? "start" : i === 5 ? "end" : "middle" });
        label.textContent = seconds(Math.round(t));
        svg.appendChild(label);
      }
      const plot = svgEl("g", { "clip-path": `url(#${clipId})` });
      svg.appendChild(plot);
      if (series.length) {
        plot.appendChild(svgEl("path", {
          d: stepPath(series, (p) => p.t_ns, (p) => p.max_bytes) + `V${y(0).toFixed(1)}Z`,
          fill: COLORS.live, "fill-opacity": "0.25", stroke: COLORS.live, "stroke-width": "1.5", class: "live",
        }));
      }
      if (reservedSeries.length) {
        plot.appendChild(svgEl("path", {
          d: stepPath(reservedSeries, (p) => p.t_ns, (p) => p.reserved),
          fill: "none", stroke: COLORS.reserved, "stroke-width": "1.5", "stroke-dasharray": "5,3", class: "reserved",
        }));
      }
      for (const p of used) {
        const dot = svgEl("circle", { cx: x(p.t_ns), cy: y(p.bytes), r: 3.5, fill: COLORS.used, class: "used" });
        dot.addEventListener("mousemove", (e) => showTip(e, "device used " + bytes(p.bytes) + " at " + seconds(p.t_ns)));
        dot.addEventListener("mouseleave", hideTip);
        plot.appendChild(dot);
      }
      for (const f of failures) {
        const line = svgEl("line", { x1: x(f.t_ns), x2: x(f.t_ns), y1: top, y2: top + plotH, stroke: COLORS.failure, "stroke-width": "2", class: "failure" });
        line.addEventListener("mousemove", (e) => showTip(e, f.api + " of " + bytes(f.request) + " failed at " + seconds(f.t_ns)));
        line.addEventListener("mouseleave", hideTip);
        plot.appendChild(line);
      }
      for (const m of marks) {
        const line = svgEl("line", { x1: x(m.t_ns), x2: x(m.t_ns), y1: top, y2: top + plotH, stroke: COLORS.mark, "stroke-dasharray": "2,2", class: "mark", "data-t": m.t_ns });
        line.addEventListener("mousemove", (e) => showTip(e, "mark " + m.text + " at " + seconds(m.t_ns) + " (pid " + m.pid + ")"));
        line.addEventListener("mouseleave", hideTip);
        plot.appendChild(line);
        const label = svgEl("text", { x: x(m.t_ns) + 3, y: top + 10, class: "mark-label" });
        label.textContent = m.text;
        plot.appendChild(label);
      }
      if (device.peak) {
        const dot = svgEl("circle", { cx: x(device.peak.t_ns), cy: y(device.peak.bytes), r: 4, fill: COLORS.peak, class: "peak" });
        dot.addEventListener("mousemove", (e) => showTip(e, "peak " + bytes(device.peak.bytes) + " at " + seconds(device.peak.t_ns)));
        dot.addEventListener("mouseleave", hideTip);
        plot.appendChild(dot);
      }
      range.textContent = "showing " + seconds(Math.round(view.x0)) + " to " + seconds(Math.round(view.x1));
    }

    svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      const rect = svg.getBoundingClientRect();
      const px = (e.clientX - rect.left) * width / rect.width;
      const center = view.x0 + (px - left) / plotW * (view.x1 - view.x0);
      zoom(e.deltaY < 0 ? 0.8 : 1.25, Math.min(Math.max(center, 0), end));
    }, { passive: false });
    let drag = null;
    svg.addEventListener("mousedown", (e) => { drag = { x: e.clientX, x0: view.x0, x1: view.x1 }; });
    window.addEventListener("mouseup", () => { drag = null; });
    svg.addEventListener("mousemove", (e) => {
      if (!drag) return;
      const rect = svg.getBoundingClientRect();
      const shift = (drag.x - e.clientX) * width / rect.width / plotW * (drag.x1 - drag.x0);
      const span = drag.x1 - drag.x0;
      view.x0 = Math.min(Math.max(0, drag.x0 + shift), end - span);
      view.x1 = view.x0 + span;
      draw();
    });
    svg.addEventListener("dblclick", () => { view.x0 = 0; view.x1 = end; draw(); });
    draw();
    return box;
  }

  // --- flame graphs ------------------------------------------------------------------------

  // A tree of frames (outermost at the root) from stack groups whose frames are innermost first.
  function stackTree(stacks) {
    const top = { label: "all", bytes: 0, children: new Map(), python: false };
    for (const stack of stacks) {
      top.bytes += stack.bytes;
      let node = top;
      for (let i = stack.frames.length - 1; i >= 0; i--) {
        const frame = stack.frames[i];
        let child = node.children.get(frame.label);
        if (!child) {
          child = { label: frame.label, bytes: 0, children: new Map(), python: isPython(frame) };
          node.children.set(frame.label, child);
        }
        child.bytes += stack.bytes;
        node = child;
      }
    }
    return top;
  }

  function depthOf(node) {
    let depth = 0;
    for (const child of node.children.values()) depth = Math.max(depth, depthOf(child));
    return depth + 1;
  }

  // Bytes under nodes matching `query` (a matching node's descendants are not counted again).
  function matchedBytes(node, query) {
    if (node.label.toLowerCase().includes(query)) return node.bytes;
    let sum = 0;
    for (const child of node.children.values()) sum += matchedBytes(child, query);
    return sum;
  }

  function flameGraph(id, title, stacks) {
    const box = el("div", { class: "flamegraph", id: id });
    box.appendChild(el("h3", {}, title));
    if (!stacks || stacks.length === 0) {
      box.appendChild(el("p", { class: "muted" }, "nothing live"));
      return box;
    }
    const tree = stackTree(stacks);
    const search = el("input", { type: "search", placeholder: "search frames", class: "search" });
    const found = el("span", { class: "found muted" });
    const reset = el("button", { type: "button" }, "reset zoom");
    box.appendChild(el("div", { class: "controls" }, search, reset, found));
    const rowHeight = 17;
    const canvas = el("div", { class: "flame" });
    box.appendChild(canvas);
    let focus = tree;

    function draw() {
      canvas.textContent = "";
      const query = search.value.trim().toLowerCase();
      canvas.style.height = (depthOf(focus) * rowHeight + 2) + "px";
      const place = (node, depth, start) => {
        const share = node.bytes / focus.bytes;
        if (share < 0.001) return;
        const cls = [node === tree ? "root" : node.python ? "python" : "",
          query && node.label.toLowerCase().includes(query) ? "match" : ""].join(" ").trim();
        const bar = el("div", {
          class: cls || null, "data-bytes": node.bytes,
          style: `left:${(start * 100).toFixed(4)}%;width:${(share * 100).toFixed(4)}%;top:${depth * rowHeight}px`,
        }, node.label);
        bar.addEventListener("mousemove", (e) => showTip(e, node.label + ": " + bytes(node.bytes) +
          " (" + (node.bytes / tree.bytes * 100).toFixed(1) + "% of " + bytes(tree.bytes) + ")"));
        bar.addEventListener("mouseleave", hideTip);
        bar.addEventListener("click", () => { focus = node; draw(); });
        canvas.appendChild(bar);
        let offset = start;
        const children = Array.from(node.children.values()).sort((a, b) => b.bytes - a.bytes);
        for (const child of children) {
          place(child, depth + 1, offset);
          offset += child.bytes / focus.bytes;
        }
      };
      place(focus, 0, 0);
      if (query) {
        const matched = matchedBytes(tree, query);
        found.textContent = "matched " + bytes(matched) + " (" + (matched / tree.bytes * 100).toFixed(1) + "%)";
      } else {
        found.textContent = "";
      }
    }
    search.value = initialSearch;
    search.addEventListener("input", draw);
    reset.addEventListener("click", () => { focus = tree; draw(); });
    draw();
    return box;
  }

  function drawFlameGraphs() {
    const node = section("flame-graphs", "Flame graphs");
    node.appendChild(el("p", { class: "muted" },
      "Bytes by call stack, callers above callees; Python frames in blue. Click a frame to zoom into it."));
    for (const device of data.peak.devices) {
      node.appendChild(flameGraph("flame-peak-" + device.device,
        "Live at the peak of " + deviceName(device.device) + ": " + bytes(device.bytes) + " at " + seconds(device.t_ns),
        device.stacks));
    }
    for (const device of data.leaks.devices) {
      node.appendChild(flameGraph("flame-leaks-" + device.device,
        "Leaks on " + deviceName(device.device) + ": " + bytes(device.bytes) + " still live at the end",
        device.stacks));
    }
    if (data.leaks.devices.length === 0) node.appendChild(el("p", {}, "no leaks: everything allocated was freed"));
    data.oom.failures.forEach((failure, index) => {
      node.appendChild(flameGraph("flame-oom-" + (index + 1),
        "Live on " + deviceName(failure.device) + " at failed allocation " + (index + 1) + " (" + seconds(failure.t_ns) + ")",
        failure.live_by_stack));
    });
  }

  // --- top stacks --------------------------------------------------------------------------

  function drawTopStacks() {
    const node = section("top-stacks", "Top stacks at the peak");
    const devices = data.summary.devices.concat(data.summary.pinned_host ? [data.summary.pinned_host] : []);
    for (const device of devices) {
      node.appendChild(el("h3", {}, deviceName(device.device) + ": peak " + bytes(device.peak_bytes)));
      node.appendChild(table(["bytes", "allocations", "share", "stack (innermost first)"],
        device.top_stacks_at_peak.map((s) => el("tr", {},
          numCell(s.bytes, bytes(s.bytes)), numCell(s.count), numCell(s.share, s.share.toFixed(1) + "%"),
          el("td", {}, framesList(s.frames, 12)))), { class: "top-stacks", "data-device": device.device }));
    }
  }

  // --- OOM verdicts ------------------------------------------------------------------------

  function drawOom() {
    const node = section("oom", "Failed allocations");
    const failures = data.oom.failures;
    if (failures.length === 0) {
      node.appendChild(el("p", { class: "good" }, "no allocation failed"));
      return;
    }
    failures.forEach((f, index) => {
      const box = el("div", { class: "failure", "data-request": f.request, "data-device": f.device });
      box.appendChild(el("h3", {}, "Failure " + (index + 1) + ": " + f.api + " of " + bytes(f.request) +
        " on " + deviceName(f.device) + " at " + seconds(f.t_ns) + " (thread " + (f.thread_name || f.thread) + ")"));
      box.appendChild(el("p", { class: "bad verdict" }, f.explanation));
      box.appendChild(el("p", {}, "free " + bytes(f.free) + " of " + bytes(f.total) + "; recorded live " +
        bytes(f.tracked_bytes) + " in " + f.tracked_count + "; untracked " + bytes(f.untracked_bytes) +
        (f.is_retry_of !== null ? "; a retry of failure " + (f.is_retry_of + 1) : "") +
        (f.retry ? "; retried after a release" : "")));
      box.appendChild(el("div", {}, "at:", framesList(f.frames, 12)));
      if (f.largest_live.length) {
        box.appendChild(table(["largest live", "api", "allocated at", "stack"],
          f.largest_live.map((l) => el("tr", {}, numCell(l.size, bytes(l.size)), el("td", {}, l.api),
            numCell(l.t_ns, seconds(l.t_ns)), el("td", {}, framesList(l.frames, 4))))));
      }
      node.appendChild(box);
    });
  }

  // --- allocator ---------------------------------------------------------------------------

  function drawAllocator() {
    const node = section("allocator", "Allocator view");
    for (const d of data.allocator.devices) {
      node.appendChild(el("h3", {}, deviceName(d.device) + ": " + d.pattern.replace(/_/g, " ")));
      node.appendChild(el("p", { class: "muted" }, d.pattern_reason));
      const rows = [
        ["reserved peak", d.reserved.peak, bytes(d.reserved.peak) + " at " + seconds(d.reserved.peak_t_ns)],
        ["reserved at the end", d.reserved.final, bytes(d.reserved.final)],
        ["cudaMalloc", d.cuda_malloc.count, d.cuda_malloc.count + " (" + bytes(d.cuda_malloc.bytes) + "), " + d.cuda_malloc.failed + " failed"],
        ["cudaFree", d.cuda_free.count, d.cuda_free.count + " (" + bytes(d.cuda_free.bytes) + ")"],
        ["empty_cache() bursts", d.empty_cache.count, d.empty_cache.count + " (" + bytes(d.empty_cache.bytes) + ")"],
        ["OOM retries", d.oom_retries.length, String(d.oom_retries.length)],
      ];
      const libraries = d.libraries;
      if (libraries && libraries.alloc.count + libraries.failed.count > 0) {
        // Driver-API allocations beside the allocator's (cuBLAS's handles and the like).
        rows.push(["libraries (driver API, not reserved)", libraries.alloc.count,
          libraries.alloc.count + " (" + bytes(libraries.alloc.bytes) + "), peak " + bytes(libraries.peak)]);
      }
      const outside = d.outside_allocator;
      if (outside) {
        rows.push(["outside any allocator (max)", outside.max, bytes(outside.max) + " over " + outside.samples + (outside.samples === 1 ? " sample" : " samples")]);
      } else {
        rows.push(["outside any allocator", "", "no memory sample"]);
      }
      node.appendChild(table(["", "value"], rows.map(([name, value, text]) =>
        el("tr", {}, el("th", {}, name), numCell(value, text))), { class: "allocator-device", "data-device": d.device }));
      if (d.segment_sizes.length) {
        node.appendChild(table(["segment size", "count", "bytes"], d.segment_sizes.map((s) =>
          el("tr", {}, numCell(s.size, bytes(s.size)), numCell(s.count), numCell(s.bytes, bytes(s.bytes))))));
      }
    }
  }

  // --- whatif ------------------------------------------------------------------------------

  function drawWhatif() {
    const node = section("whatif", "What if: PYTORCH_CUDA_ALLOC_CONF settings");
    const whatif = data.whatif;
    if (typeof whatif === "string") {
      node.appendChild(el("p", { class: "muted", id: "whatif-absent" }, whatif));
      return;
    }
    node.appendChild(el("p", {}, deviceName(whatif.device) + " of " + whatif.log + ", capacity " +
      (whatif.capacity === null ? "unlimited" : bytes(whatif.capacity))));
    node.appendChild(table(["rank", "setting", "peak reserved", "peak allocated", "cudaMalloc calls", "OOMs", "fits"],
      whatif.configs.map((c) => el("tr", {},
        numCell(c.rank), el("td", {}, c.label === "" ? "(default)" : c.label),
        numCell(c.peak_reserved, bytes(c.peak_reserved)), numCell(c.peak_allocated, bytes(c.peak_allocated)),
        numCell(c.num_device_alloc), numCell(c.num_ooms),
        el("td", { class: c.fits ? "good" : "bad" }, c.fits ? "yes" : "no"))), { id: "whatif-table" }));
    if (whatif.notes.length) node.appendChild(el("ul", { class: "muted" }, whatif.notes.map((n) => el("li", {}, n))));
  }

  root.textContent = "";
  drawSummary();
  drawTimelines();
  drawFlameGraphs();
  drawTopStacks();
  drawOom();
  drawAllocator();
  drawWhatif();
  root.setAttribute("data-ready", "true");
})();
