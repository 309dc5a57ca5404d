// The import layering of the TypeScript code, checked by `npm test` (dependency-cruiser).
// Floors from the bottom: a folder imports only folders on floors below its own (and
// itself), so nothing below commands/ reaches up into them, and no two folders lean on each
// other. A new folder gets a floor here; moving a folder up or down is a decision, made here.
const FLOORS = [
  ["src/runtime"], // processes, files, errors, progress, HTTP plumbing
  ["src/config", "src/tensors", "src/text", "src/rl"], // schemas, safetensors, tokenizers, RL math
  ["src/command", "src/data", "src/reward", "src/hub", "src/ckpt", "src/trainer", "src/nodes"],
  ["src/tracking", "src/planning"], // a run's metrics and trackers; its memory plan (over trainer/)
  ["src/engine", "src/retrieval"], // clients and servers of the engine and the retriever
  ["src/agent"], // the search rollout over an engine and a retriever
  ["src/eval"],
  ["src/train"], // the controller of one run: steps, validation, checkpoints
  ["src/world"], // the quickstart's invented world: generators
  ["src/quickstart"], // the quickstart's pipeline
  ["commands"], // one file per command
  ["cli"], // the entry: the command tree and main()
];

const asPattern = (folder) => folder.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
const floorOf = new Map(FLOORS.flatMap((folders, floor) => folders.map((f) => [f, floor])));

const upward = [...floorOf].map(([folder, floor]) => {
  const sameOrAbove = [...floorOf]
    .filter(([other, otherFloor]) => other !== folder && otherFloor >= floor)
    .map(([other]) => asPattern(other));
  return {
    name: `floor:${folder}`,
    comment: `${folder} imports only folders on lower floors (see FLOORS in .dependency-cruiser.cjs)`,
    severity: "error",
    from: { path: `^${asPattern(folder)}/` },
    to: { path: `^(${sameOrAbove.join("|")})/` },
  };
});

module.exports = {
  forbidden: [
    {
      name: "no-circular",
      comment: "modules that import each other, directly or through others",
      severity: "error",
      from: {},
      to: { circular: true },
    },
    {
      name: "known-floor",
      comment: "every folder of cli/, commands/ and src/ has a floor in FLOORS",
      severity: "error",
      from: {
        path: "^(cli|commands|src/[^/]+)/",
        pathNot: `^(${[...floorOf.keys()].map(asPattern).join("|")})/`,
      },
      to: {},
    },
    ...upward,
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsConfig: { fileName: "tsconfig.json" },
    tsPreCompilationDeps: true,
  },
};
