// layout.js: a layered (Sugiyama-style) DAG layout, left to right, with no dependencies.
//   1. layers by longest path from the sources;
//   2. long edges broken into chains of dummy vertices, one per layer crossed;
//   3. order within layers by barycentre sweeps (down and up) plus adjacent transpositions,
//      keeping the order with the fewest crossings;
//   4. vertical positions by weighted isotonic regression (pool-adjacent-violators) towards
//      the neighbours' mean, which keeps order and spacing and straightens long edges;
//   5. edges routed through their dummies, with ports spread along each node's side.
// Pure: layout(nodes, edges, options) -> {nodes: Map, edges: [], width, height, crossings}.

const DEFAULTS = {
  nodeWidth: 184,
  nodeHeight: 52,
  layerGap: 72, // horizontal space between layers
  nodeGap: 20, // vertical space between two nodes of a layer
  dummyGap: 10, // vertical space next to an edge passing through a layer
  dummySize: 6,
  margin: 24,
  sweeps: 16,
};

/**
 * nodes: [{id, width?, height?}], edges: [{from, to, ...}] (unknown ends and self loops are
 * dropped from the layout but kept out of the result). Returns positions of node centres.
 */
export function layout(nodes, edges, options = {}) {
  const o = { ...DEFAULTS, ...options };
  const g = buildGraph(nodes, edges, o);
  assignLayers(g);
  insertDummies(g, o);
  const layers = orderLayers(g, o.sweeps);
  const crossings = totalCrossings(g, layers);
  const columns = placeX(g, layers, o);
  placeY(g, layers, o);
  return finish(g, layers, columns, crossings, o);
}

function buildGraph(nodes, edges, o) {
  const vs = [];
  const byId = new Map();
  for (const n of nodes) {
    if (byId.has(n.id)) continue;
    const v = {
      id: n.id,
      index: vs.length,
      real: true,
      width: n.width ?? o.nodeWidth,
      height: n.height ?? o.nodeHeight,
      preds: [],
      succs: [],
      layer: 0,
      pos: 0,
      y: 0,
    };
    vs.push(v);
    byId.set(n.id, v);
  }
  const real = [];
  const seen = new Set();
  for (const e of edges) {
    const a = byId.get(e.from);
    const b = byId.get(e.to);
    if (!a || !b || a === b) continue;
    real.push({ edge: e, from: a, to: b, chain: [] });
    const key = `${a.index}>${b.index}`;
    if (!seen.has(key)) {
      seen.add(key);
      a.succs.push(b);
      b.preds.push(a);
    }
  }
  return { vs, byId, real };
}

/** Longest path from the sources (Kahn's order); a cycle's leftovers go after the rest. */
function assignLayers(g) {
  const indeg = g.vs.map((v) => v.preds.length);
  const queue = g.vs.filter((v) => indeg[v.index] === 0);
  const done = new Set();
  for (let i = 0; i < queue.length; i++) {
    const v = queue[i];
    done.add(v);
    for (const w of v.succs) {
      w.layer = Math.max(w.layer, v.layer + 1);
      if (--indeg[w.index] === 0) queue.push(w);
    }
  }
  if (done.size < g.vs.length) {
    // Not a DAG (the API refuses cycles, but draw something rather than nothing).
    let next = Math.max(0, ...[...done].map((v) => v.layer)) + 1;
    for (const v of g.vs) if (!done.has(v)) v.layer = next++;
  }
}

/** Replace each edge spanning k > 1 layers by a chain through k - 1 dummy vertices. */
function insertDummies(g, o) {
  // Layering edges are rebuilt so every edge joins adjacent layers.
  for (const v of g.vs) {
    v.preds = [];
    v.succs = [];
  }
  const link = (a, b) => {
    if (!a.succs.includes(b)) {
      a.succs.push(b);
      b.preds.push(a);
    }
  };
  const chains = new Map(); // one dummy chain per (from, to) pair, shared by parallel edges
  for (const r of g.real) {
    const { from, to } = r;
    if (to.layer <= from.layer) continue; // only possible for a cycle: drawn straight
    const key = `${from.index}>${to.index}`;
    if (!chains.has(key)) {
      const chain = [];
      let prev = from;
      for (let l = from.layer + 1; l < to.layer; l++) {
        const d = {
          id: `\u0000${key}:${l}`,
          index: g.vs.length,
          real: false,
          width: o.dummySize,
          height: o.dummySize,
          preds: [],
          succs: [],
          layer: l,
          pos: 0,
          y: 0,
        };
        g.vs.push(d);
        link(prev, d);
        chain.push(d);
        prev = d;
      }
      link(prev, to);
      chains.set(key, chain);
    }
    r.chain = chains.get(key);
  }
}

function orderLayers(g, sweeps) {
  const depth = Math.max(0, ...g.vs.map((v) => v.layer)) + 1;
  const layers = Array.from({ length: depth }, () => []);
  // Initial order: depth-first from the sources in input order, so subtrees start together.
  const visited = new Set();
  const visit = (v) => {
    if (visited.has(v)) return;
    visited.add(v);
    layers[v.layer].push(v);
    for (const w of v.succs) visit(w);
  };
  for (const v of g.vs) if (v.real && v.preds.length === 0) visit(v);
  for (const v of g.vs) visit(v);
  renumber(layers);

  let best = layers.map((l) => l.slice());
  let bestCross = totalCrossings(g, layers);
  for (let i = 0; i < sweeps && bestCross > 0; i++) {
    const down = i % 2 === 0;
    if (down) for (let l = 1; l < depth; l++) sortByBarycentre(layers[l], "preds");
    else for (let l = depth - 2; l >= 0; l--) sortByBarycentre(layers[l], "succs");
    renumber(layers);
    transpose(layers);
    const c = totalCrossings(g, layers);
    if (c < bestCross) {
      bestCross = c;
      best = layers.map((l) => l.slice());
    }
  }
  renumber(best);
  return best;
}

function renumber(layers) {
  for (const layer of layers) layer.forEach((v, i) => (v.pos = i));
}

function sortByBarycentre(layer, side) {
  const keyed = layer.map((v) => {
    const ns = v[side];
    const bc = ns.length ? ns.reduce((sum, n) => sum + n.pos, 0) / ns.length : v.pos;
    return { v, bc, tie: v.pos };
  });
  keyed.sort((a, b) => a.bc - b.bc || a.tie - b.tie);
  keyed.forEach((k, i) => (layer[i] = k.v));
}

/** Crossings between the edges of u and of v (u above v) towards one neighbouring layer. */
function pairCrossings(u, v, side) {
  let c = 0;
  for (const a of u[side]) for (const b of v[side]) if (a.pos > b.pos) c++;
  return c;
}

/** Swap neighbours while that removes crossings (a few passes). */
function transpose(layers) {
  for (let pass = 0; pass < 4; pass++) {
    let improved = false;
    for (const layer of layers) {
      for (let i = 0; i + 1 < layer.length; i++) {
        const u = layer[i];
        const v = layer[i + 1];
        const now = pairCrossings(u, v, "preds") + pairCrossings(u, v, "succs");
        const swapped = pairCrossings(v, u, "preds") + pairCrossings(v, u, "succs");
        if (swapped < now) {
          layer[i] = v;
          layer[i + 1] = u;
          u.pos = i + 1;
          v.pos = i;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
}

/** Crossings over all adjacent layer pairs (inversion count with a Fenwick tree). */
export function totalCrossings(g, layers) {
  let total = 0;
  for (let l = 0; l + 1 < layers.length; l++) {
    const pairs = [];
    for (const v of layers[l]) for (const w of v.succs) if (w.layer === l + 1) pairs.push([v.pos, w.pos]);
    pairs.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const size = layers[l + 1].length;
    const tree = new Array(size + 1).fill(0);
    let seen = 0;
    for (const [, p] of pairs) {
      let le = 0; // how many earlier edges end at or above p
      for (let i = p + 1; i > 0; i -= i & -i) le += tree[i];
      total += seen - le;
      for (let i = p + 1; i <= size; i += i & -i) tree[i] += 1;
      seen++;
    }
  }
  return total;
}

function placeX(g, layers, o) {
  const columns = [];
  let x = o.margin;
  for (const layer of layers) {
    const width = Math.max(o.dummySize, ...layer.map((v) => v.width));
    columns.push({ left: x, width, center: x + width / 2 });
    for (const v of layer) v.x = x + width / 2;
    x += width + o.layerGap;
  }
  return columns;
}

function separation(a, b, o) {
  const gap = a.real && b.real ? o.nodeGap : o.dummyGap;
  return (a.height + b.height) / 2 + gap;
}

function placeY(g, layers, o) {
  // Start stacked and centred on 0.
  for (const layer of layers) {
    let y = 0;
    layer.forEach((v, i) => {
      if (i > 0) y += separation(layer[i - 1], v, o);
      v.y = y;
    });
    const mid = y / 2;
    for (const v of layer) v.y -= mid;
  }
  const mean = (ns) => ns.reduce((sum, n) => sum + n.y, 0) / ns.length;
  const rounds = 10;
  for (let r = 0; r < rounds; r++) {
    const both = r >= rounds - 2;
    const order = r % 2 === 0 ? layers : [...layers].reverse();
    for (const layer of order) {
      const targets = layer.map((v) => {
        const ns = both ? [...v.preds, ...v.succs] : r % 2 === 0 ? v.preds : v.succs;
        if (!ns.length) return { t: v.y, w: 0.25 };
        return { t: mean(ns), w: v.real ? 1 : 2.5 };
      });
      isotonicPlace(layer, targets, o);
    }
  }
}

/** Closest positions to `targets` (weighted least squares) that keep order and spacing. */
function isotonicPlace(layer, targets, o) {
  const offsets = [0];
  for (let i = 1; i < layer.length; i++) offsets.push(offsets[i - 1] + separation(layer[i - 1], layer[i], o));
  const blocks = []; // pool-adjacent-violators over z_i = y_i - offset_i
  layer.forEach((v, i) => {
    let block = { sum: targets[i].w * (targets[i].t - offsets[i]), weight: targets[i].w, count: 1 };
    block.value = block.weight ? block.sum / block.weight : 0;
    while (blocks.length && blocks[blocks.length - 1].value >= block.value) {
      const prev = blocks.pop();
      const sum = prev.sum + block.sum;
      const weight = prev.weight + block.weight;
      block = { sum, weight, count: prev.count + block.count, value: weight ? sum / weight : prev.value };
    }
    blocks.push(block);
  });
  let i = 0;
  for (const b of blocks) {
    for (let k = 0; k < b.count; k++, i++) layer[i].y = b.value + offsets[i];
  }
}

function finish(g, layers, columns, crossings, o) {
  let top = Infinity;
  let bottom = -Infinity;
  for (const v of g.vs) {
    top = Math.min(top, v.y - v.height / 2);
    bottom = Math.max(bottom, v.y + v.height / 2);
  }
  if (!g.vs.length) top = bottom = 0;
  const shift = o.margin - top;
  for (const v of g.vs) v.y += shift;

  const nodes = new Map();
  for (const v of g.vs) {
    if (v.real) nodes.set(v.id, { id: v.id, x: v.x, y: v.y, width: v.width, height: v.height, layer: v.layer, order: v.pos });
  }

  // Routes: out of the right side, through each dummy's column, into the left side.
  const routes = g.real.map((r) => {
    const pts = [{ x: r.from.x + r.from.width / 2, y: r.from.y }];
    for (const d of r.chain) {
      const col = columns[d.layer];
      pts.push({ x: col.left, y: d.y }, { x: col.left + col.width, y: d.y });
    }
    pts.push({ x: r.to.x - r.to.width / 2, y: r.to.y });
    return { edge: r.edge, from: r.from.id, to: r.to.id, points: pts };
  });
  spreadPorts(routes, nodes);

  const last = columns[columns.length - 1];
  return {
    nodes,
    edges: routes,
    width: (last ? last.left + last.width : 0) + o.margin,
    height: bottom - top + 2 * o.margin,
    crossings,
    layers: layers.length,
  };
}

/** Fan the edges at a node's side out over its middle, ordered by where they come from. */
function spreadPorts(routes, nodes) {
  const groups = new Map();
  const add = (key, route, end) => {
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push({ route, end });
  };
  for (const r of routes) {
    add(`out:${r.from}`, r, "start");
    add(`in:${r.to}`, r, "end");
  }
  for (const [key, list] of groups) {
    if (list.length < 2) continue;
    const node = nodes.get(key.slice(key.indexOf(":") + 1));
    const other = (item) => (item.end === "start" ? item.route.points[1] : item.route.points[item.route.points.length - 2]);
    list.sort((a, b) => other(a).y - other(b).y);
    const spread = Math.min(node.height * 0.6, (list.length - 1) * 8);
    list.forEach((item, i) => {
      const dy = list.length === 1 ? 0 : -spread / 2 + (spread * i) / (list.length - 1);
      const p = item.end === "start" ? item.route.points[0] : item.route.points[item.route.points.length - 1];
      p.y = node.y + dy;
    });
  }
}

/** An SVG path through the route's points, with horizontal tangents at each point. */
export function pathData(points) {
  if (!points.length) return "";
  let d = `M${r1(points[0].x)},${r1(points[0].y)}`;
  for (let i = 1; i < points.length; i++) {
    const a = points[i - 1];
    const b = points[i];
    const dx = (b.x - a.x) / 2;
    if (Math.abs(a.y - b.y) < 0.5) d += ` L${r1(b.x)},${r1(b.y)}`;
    else d += ` C${r1(a.x + dx)},${r1(a.y)} ${r1(b.x - dx)},${r1(b.y)} ${r1(b.x)},${r1(b.y)}`;
  }
  return d;
}

function r1(n) {
  return Math.round(n * 10) / 10;
}
