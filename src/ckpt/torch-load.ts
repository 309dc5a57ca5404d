/**
 * `torch.load` without Python and without executing anything: the zip container
 * (`<stem>/data.pkl`, `<stem>/data/<key>`), the pickle read by our own reader, and
 * torch's tensor rebuild functions reimplemented for the handful of globals they use.
 * Every other global becomes an inert record; globals that only a hostile file would
 * name (os.system, eval, subprocess, ...) make the load fail.
 */
import { InputError } from "../runtime/errors.js";
import type { DType } from "../tensors/safetensors.js";
import { type Callable, PickleError, PyGlobal, PyObject, unpickle } from "./pickle.js";
import type { Conversion, SourceTensor } from "./source.js";
import { type TorchStorage, TorchTensor } from "./torch-tensor.js";
import { ZipArchive } from "./zip.js";

const STORAGE_DTYPE: Record<string, DType> = {
  FloatStorage: "F32",
  DoubleStorage: "F64",
  HalfStorage: "F16",
  BFloat16Storage: "BF16",
  LongStorage: "I64",
  IntStorage: "I32",
  ShortStorage: "I16",
  CharStorage: "I8",
  ByteStorage: "U8",
  BoolStorage: "BOOL",
};

/** `torch.<name>` dtype globals, as `_rebuild_tensor_v3` and DTensor metadata name them. */
const TORCH_DTYPE: Record<string, DType> = {
  float32: "F32",
  float: "F32",
  float64: "F64",
  double: "F64",
  float16: "F16",
  half: "F16",
  bfloat16: "BF16",
  int64: "I64",
  long: "I64",
  int32: "I32",
  int: "I32",
  int16: "I16",
  short: "I16",
  int8: "I8",
  uint8: "U8",
  bool: "BOOL",
};

/** Modules and builtins whose mere mention marks a pickle as an attempt to run code. */
const FORBIDDEN_MODULES = new Set([
  "os",
  "posix",
  "nt",
  "subprocess",
  "sys",
  "shutil",
  "socket",
  "importlib",
  "runpy",
  "pickle",
  "_pickle",
  "marshal",
  "code",
  "pty",
  "ctypes",
  "multiprocessing",
  "signal",
  "webbrowser",
  "pdb",
  "timeit",
]);
const FORBIDDEN_BUILTINS = new Set([
  "eval",
  "exec",
  "compile",
  "open",
  "setattr",
  "delattr",
  "__import__",
  "globals",
  "locals",
  "vars",
  "input",
  "breakpoint",
  "exit",
  "quit",
]);

/** A DTensor as saved by torch ≥ 2: this rank's local tensor and how it is placed. */
export class DTensorShard {
  constructor(
    readonly globalShape: number[],
    readonly local: TorchTensor,
    readonly placements: Placement[],
  ) {}
}

export type Placement =
  | { kind: "shard"; dim: number }
  | { kind: "replicate" }
  | { kind: "other"; name: string };

/** A wrapper-subclass tensor (DTensor) before its state is attached: no data of its own. */
class WrapperTensor {
  constructor(
    readonly cls: unknown,
    readonly shape: number[],
  ) {}
}

export interface TorchFile {
  archive: ZipArchive;
  value: unknown;
}

/** Loads a torch.save file: the unpickled object, tensors left lazy in the open archive. */
export async function loadTorchFile(path: string): Promise<TorchFile> {
  const archive = await ZipArchive.open(path);
  try {
    const pkl = [...archive.entries.values()].find((e) => /^[^/]+\/data\.pkl$/.test(e.name));
    if (!pkl) throw new InputError(`${path}: not a torch.save checkpoint (no <name>/data.pkl)`);
    const stem = pkl.name.slice(0, -"data.pkl".length);
    const order = archive.entries.get(`${stem}byteorder`);
    if (order && (await archive.read(order)).toString() !== "little") {
      throw new InputError(`${path}: big-endian checkpoints are not supported`);
    }
    const bytes = await archive.read(pkl);
    const storages = new Map<string, TorchStorage>();
    const persistentLoad = (pid: unknown): unknown => {
      if (!Array.isArray(pid) || pid[0] !== "storage" || !(pid[1] instanceof PyGlobal)) {
        throw new PickleError(`unsupported persistent id ${describe(pid)}`);
      }
      const key = String(pid[2]);
      let storage = storages.get(key);
      if (!storage) {
        const typeName = pid[1].qualified;
        storage = {
          key,
          typeName,
          dtype: pid[1].module === "torch" ? STORAGE_DTYPE[pid[1].name] : undefined,
          archive,
          entry: archive.entries.get(`${stem}data/${key}`),
        };
        // torch ≥ 2 untyped storages take their dtype from _rebuild_tensor_v3.
        if (typeName === "torch.UntypedStorage") storage.dtype = "U8";
        storages.set(key, storage);
      }
      return storage;
    };
    try {
      return { archive, value: unpickle(bytes, { global: resolveGlobal, persistentLoad }) };
    } catch (e) {
      if (e instanceof PickleError) throw new InputError(`${path}: ${pkl.name}: ${e.message}`);
      throw e;
    }
  } catch (e) {
    await archive.close();
    throw e;
  }
}

/**
 * Loads the rank files of one checkpoint and plans its tensors from their values (in file
 * order). The archives stay open for the lazy reads until the conversion is closed, and are
 * closed at once if a file or the planning fails.
 */
export async function convertTorchFiles(
  files: readonly string[],
  plan: (values: unknown[]) => SourceTensor[],
): Promise<Conversion> {
  const opened: TorchFile[] = [];
  const close = async () => {
    await Promise.all(opened.map((f) => f.archive.close()));
  };
  try {
    for (const file of files) opened.push(await loadTorchFile(file));
    return { tensors: plan(opened.map((f) => f.value)), close };
  } catch (e) {
    await close();
    throw e;
  }
}

function resolveGlobal(module: string, name: string): Callable | undefined {
  const root = module.split(".")[0] as string;
  const builtin = module === "builtins" || module === "__builtin__";
  if (FORBIDDEN_MODULES.has(root) || (builtin && FORBIDDEN_BUILTINS.has(name))) {
    throw new PickleError(`refusing global ${module}.${name}: a checkpoint has no use for it`);
  }
  return HANDLERS[`${module}.${name}`];
}

const tensorV2: Callable = {
  call: ([storage, offset, size, stride]) => makeTensor(storage, offset, size, stride),
};
const first: Callable = { call: (args) => args[0] };
const newList: Callable = { call: (args) => (Array.isArray(args[0]) ? [...args[0]] : []) };

/** `getattr(SomeClass, "name")` names a class attribute: another inert global. */
const getattrGlobal: Callable = {
  call: ([owner, name]) => {
    if (owner instanceof PyGlobal && typeof name === "string") {
      return new PyGlobal(owner.module, `${owner.name}.${name}`);
    }
    return new PyObject(new PyGlobal("builtins", "getattr"), [owner, name]);
  },
};

const HANDLERS: Record<string, Callable> = {
  "torch._utils._rebuild_tensor": tensorV2,
  "torch._utils._rebuild_tensor_v2": tensorV2,
  "torch._utils._rebuild_tensor_v3": {
    call: ([storage, offset, size, stride, , , dtype]) =>
      makeTensor(storage, offset, size, stride, dtypeOf(dtype)),
  },
  "torch._utils._rebuild_parameter": first,
  "torch._utils._rebuild_parameter_with_state": first,
  "torch._utils._rebuild_wrapper_subclass": {
    call: ([cls, , size]) => new WrapperTensor(cls, intList(size, "wrapper size")),
  },
  "torch._tensor._rebuild_from_type_v2": { call: (args) => rebuildFromType(args) },
  "torch._tensor._rebuild_from_type": { call: (args) => rebuildFromType(args) },
  "collections.OrderedDict": {
    call: ([items]) => new Map(Array.isArray(items) ? (items as [unknown, unknown][]) : []),
  },
  "torch.Size": newList,
  "builtins.set": newList,
  "builtins.frozenset": newList,
  "__builtin__.set": newList,
  "__builtin__.frozenset": newList,
  // Python ≥ 3.11 pickles enum members (Megatron's args) as getattr(EnumClass, "member").
  "builtins.getattr": getattrGlobal,
  "__builtin__.getattr": getattrGlobal,
  "builtins.bytearray": { call: ([b]) => Buffer.from((b as Buffer | undefined) ?? []) },
  // Protocol 2 pickles Python 3 bytes as _codecs.encode(text, "latin1").
  "_codecs.encode": {
    call: ([text, encoding]) =>
      typeof text === "string" && (encoding === "latin1" || encoding === "latin-1")
        ? Buffer.from(text, "latin1")
        : new PyObject(new PyGlobal("_codecs", "encode"), [text, encoding]),
  },
};

function dtypeOf(g: unknown): DType | undefined {
  return g instanceof PyGlobal && g.module === "torch" ? TORCH_DTYPE[g.name] : undefined;
}

function intList(v: unknown, what: string): number[] {
  if (!Array.isArray(v) || !v.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new PickleError(`${what} is not a list of sizes: ${describe(v)}`);
  }
  return v as number[];
}

function makeTensor(
  storage: unknown,
  offset: unknown,
  size: unknown,
  stride: unknown,
  dtype?: DType,
): TorchTensor {
  if (!storage || typeof storage !== "object" || !("key" in storage)) {
    throw new PickleError(`tensor storage is not a storage record: ${describe(storage)}`);
  }
  const s = storage as TorchStorage;
  const shape = intList(size, "tensor size");
  const strides = intList(stride, "tensor stride");
  if (strides.length !== shape.length)
    throw new PickleError("tensor size and stride differ in rank");
  if (!Number.isSafeInteger(offset) || (offset as number) < 0) {
    throw new PickleError(`bad storage offset ${describe(offset)}`);
  }
  const elementType = s.typeName === "torch.UntypedStorage" ? dtype : s.dtype;
  return new TorchTensor(s, elementType, offset as number, shape, strides);
}

/** `_rebuild_from_type_v2(func, type, args, state)`: tensor subclasses, DTensor above all. */
function rebuildFromType([func, type, args, state]: unknown[]): unknown {
  const handler = func instanceof PyGlobal ? HANDLERS[func.qualified] : undefined;
  const base = handler && Array.isArray(args) ? handler.call(args) : undefined;
  if (base instanceof WrapperTensor && type instanceof PyGlobal && type.name === "DTensor") {
    const local = attr(state, "_local_tensor");
    if (!(local instanceof TorchTensor)) throw new PickleError("DTensor without a local tensor");
    const placements = attr(attr(state, "_spec"), "placements");
    if (!Array.isArray(placements)) throw new PickleError("DTensor without placements");
    return new DTensorShard(base.shape, local, placements.map(placementOf));
  }
  if (base instanceof TorchTensor) return base;
  return new PyObject(type instanceof PyGlobal ? type : new PyGlobal("?", "?"), [args, state]);
}

function placementOf(p: unknown): Placement {
  const name = p instanceof PyObject ? p.cls.name : describe(p);
  if (name === "Replicate") return { kind: "replicate" };
  if (name === "Shard") {
    const dim = attr(p, "dim") ?? (p as PyObject).args[0];
    if (Number.isSafeInteger(dim)) return { kind: "shard", dim: dim as number };
  }
  return { kind: "other", name };
}

/** An attribute of a record: from its __dict__ state, its slots state, or a plain dict. */
function attr(obj: unknown, name: string): unknown {
  const state = obj instanceof PyObject ? obj.state : obj;
  const parts = Array.isArray(state) ? state : [state];
  for (const part of parts) {
    if (part instanceof Map && part.has(name)) return part.get(name);
  }
  return undefined;
}

export function describe(v: unknown): string {
  if (v instanceof PyGlobal) return v.qualified;
  if (v instanceof PyObject) return `${v.cls.qualified}(...)`;
  if (v instanceof TorchTensor) return `tensor [${v.shape.join(", ")}]`;
  if (v instanceof DTensorShard) return "DTensor";
  if (v instanceof Map) return "dict";
  if (Array.isArray(v)) return "list";
  return JSON.stringify(v) ?? String(v);
}
