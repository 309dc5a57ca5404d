/**
 * A pickle reader that executes nothing. It understands the opcodes of protocols 0–5 that
 * `torch.save` and Python's pickler emit for in-band data, and builds plain values:
 * None → null, ints → number (bigint beyond 2^53), str → string, bytes → Buffer,
 * list and tuple → arrays, dict → Map. A global (a class or function named by module and
 * name) never imports anything: the caller's `global` hook either maps it to one of the
 * caller's own functions (torch's tensor rebuilders) or it stays a `PyGlobal`, and calling
 * or instantiating one yields an inert `PyObject` record of what would have happened.
 */

/** A class or function the pickle names. */
export class PyGlobal {
  constructor(
    readonly module: string,
    readonly name: string,
  ) {}
  get qualified(): string {
    return `${this.module}.${this.name}`;
  }
}

/** What a call or instantiation of a `PyGlobal` would have built: never executed. */
export class PyObject {
  state: unknown = undefined;
  readonly listItems: unknown[] = [];
  readonly dictItems = new Map<unknown, unknown>();
  constructor(
    readonly cls: PyGlobal,
    readonly args: unknown[],
  ) {}
}

/** A global that the caller implements: `call` gets the positional arguments. */
export interface Callable {
  call(args: unknown[]): unknown;
}

export interface UnpickleHooks {
  /** Resolves a global: a Callable of the caller's, or undefined to keep it inert. May throw to refuse. */
  global(module: string, name: string): Callable | undefined;
  /** Resolves a persistent id (torch: storages). */
  persistentLoad(pid: unknown): unknown;
}

export class PickleError extends Error {}

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** Unpickles `data`; errors name the byte offset of the opcode at fault. */
export function unpickle(data: Uint8Array, hooks: UnpickleHooks): unknown {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  let pos = 0;
  let opAt = 0;
  const stack: unknown[] = [];
  const marks: number[] = [];
  const memo = new Map<number, unknown>();
  const globals = new Map<unknown, Callable>();

  const fail = (why: string): never => {
    throw new PickleError(`pickle byte ${opAt}: ${why}`);
  };
  const need = (n: number) => {
    if (n < 0 || pos + n > buf.length) fail("truncated data");
  };
  const u8 = () => {
    need(1);
    return buf[pos++] as number;
  };
  const u16 = () => {
    need(2);
    pos += 2;
    return buf.readUInt16LE(pos - 2);
  };
  const u32 = () => {
    need(4);
    pos += 4;
    return buf.readUInt32LE(pos - 4);
  };
  const i32 = () => {
    need(4);
    pos += 4;
    return buf.readInt32LE(pos - 4);
  };
  const u64 = () => {
    need(8);
    pos += 8;
    const v = buf.readBigUInt64LE(pos - 8);
    if (v > MAX_SAFE) fail("length too large");
    return Number(v);
  };
  const bytes = (n: number) => {
    need(n);
    pos += n;
    return Buffer.from(buf.subarray(pos - n, pos));
  };
  const line = () => {
    const end = buf.indexOf(0x0a, pos);
    if (end < 0) fail("truncated data (no end of line)");
    const s = buf.toString("latin1", pos, end);
    pos = end + 1;
    return s;
  };
  const pop = () => {
    if (stack.length === 0 || (marks.length > 0 && stack.length <= (marks.at(-1) as number))) {
      fail("stack underflow");
    }
    return stack.pop();
  };
  const top = () => {
    if (stack.length === 0) fail("stack underflow");
    return stack[stack.length - 1];
  };
  const popMark = () => {
    const m = marks.pop();
    if (m === undefined) fail("no mark on the stack");
    return stack.splice(m as number);
  };
  const resolveGlobal = (module: string, name: string) => {
    const g = new PyGlobal(module, name);
    const callable = hooks.global(module, name);
    if (callable) globals.set(g, callable);
    return g;
  };
  const call = (fn: unknown, args: unknown[]) => {
    const callable = globals.get(fn);
    if (callable) return callable.call(args);
    if (fn instanceof PyGlobal) return new PyObject(fn, args);
    return fail("call of something that is not a global");
  };
  const setItems = (target: unknown, items: unknown[]) => {
    if (items.length % 2 !== 0) fail("odd number of dict items");
    const map =
      target instanceof Map ? target : target instanceof PyObject ? target.dictItems : undefined;
    if (!map) return fail("SETITEM on something that is not a dict");
    for (let i = 0; i < items.length; i += 2) map.set(items[i], items[i + 1]);
  };
  const appendItems = (target: unknown, items: unknown[]) => {
    if (Array.isArray(target)) target.push(...items);
    else if (target instanceof PyObject) target.listItems.push(...items);
    else fail("APPEND on something that is not a list");
  };
  const long = (b: Buffer): number | bigint => {
    if (b.length === 0) return 0;
    let v = 0n;
    for (let i = b.length - 1; i >= 0; i--) v = (v << 8n) | BigInt(b[i] as number);
    if ((b[b.length - 1] as number) & 0x80) v -= 1n << BigInt(8 * b.length);
    return v >= -MAX_SAFE && v <= MAX_SAFE ? Number(v) : v;
  };
  const memoGet = (key: number) => {
    if (!memo.has(key)) fail(`memo key ${key} was never stored`);
    return memo.get(key);
  };
  const textInt = (s: string): number | bigint | boolean => {
    if (s === "01") return true;
    if (s === "00") return false;
    const t = s.endsWith("L") ? s.slice(0, -1) : s;
    if (!/^[-+]?\d+$/.test(t)) fail(`bad integer literal ${JSON.stringify(s)}`);
    const v = BigInt(t);
    return v >= -MAX_SAFE && v <= MAX_SAFE ? Number(v) : v;
  };

  for (;;) {
    opAt = pos;
    const op = u8();
    switch (op) {
      case 0x80: // PROTO
        if (u8() > 5) fail("pickle protocol newer than 5");
        break;
      case 0x95: // FRAME: only a length hint
        u64();
        break;
      case 0x2e: // STOP
        if (stack.length !== 1 || marks.length > 0) fail("STOP with a malformed stack");
        return stack[0];
      case 0x28: // MARK
        marks.push(stack.length);
        break;
      case 0x30: // POP
        pop();
        break;
      case 0x31: // POP_MARK
        popMark();
        break;
      case 0x32: // DUP
        stack.push(top());
        break;
      case 0x4e: // NONE
        stack.push(null);
        break;
      case 0x88: // NEWTRUE
        stack.push(true);
        break;
      case 0x89: // NEWFALSE
        stack.push(false);
        break;
      case 0x4a: // BININT
        stack.push(i32());
        break;
      case 0x4b: // BININT1
        stack.push(u8());
        break;
      case 0x4d: // BININT2
        stack.push(u16());
        break;
      case 0x49: // INT
        stack.push(textInt(line()));
        break;
      case 0x4c: // LONG
        stack.push(textInt(line()));
        break;
      case 0x8a: // LONG1
        stack.push(long(bytes(u8())));
        break;
      case 0x8b: // LONG4
        stack.push(long(bytes(i32())));
        break;
      case 0x47: // BINFLOAT
        need(8);
        pos += 8;
        stack.push(buf.readDoubleBE(pos - 8));
        break;
      case 0x46: {
        // FLOAT
        const v = Number(line());
        stack.push(v);
        break;
      }
      case 0x58: // BINUNICODE
        stack.push(bytes(u32()).toString("utf8"));
        break;
      case 0x8c: // SHORT_BINUNICODE
        stack.push(bytes(u8()).toString("utf8"));
        break;
      case 0x8d: // BINUNICODE8
        stack.push(bytes(u64()).toString("utf8"));
        break;
      case 0x56: // UNICODE (raw-unicode-escape, enough for ASCII names)
        stack.push(line());
        break;
      case 0x53: {
        // STRING: a quoted Python 2 str literal
        const s = line();
        stack.push(s.length >= 2 ? s.slice(1, -1) : s);
        break;
      }
      case 0x54: // BINSTRING
        stack.push(bytes(i32()).toString("latin1"));
        break;
      case 0x55: // SHORT_BINSTRING
        stack.push(bytes(u8()).toString("latin1"));
        break;
      case 0x42: // BINBYTES
        stack.push(bytes(u32()));
        break;
      case 0x43: // SHORT_BINBYTES
        stack.push(bytes(u8()));
        break;
      case 0x8e: // BINBYTES8
      case 0x96: // BYTEARRAY8
        stack.push(bytes(u64()));
        break;
      case 0x29: // EMPTY_TUPLE
        stack.push([]);
        break;
      case 0x85: // TUPLE1
        stack.push([pop()]);
        break;
      case 0x86: {
        // TUPLE2
        const b = pop();
        stack.push([pop(), b]);
        break;
      }
      case 0x87: {
        // TUPLE3
        const c = pop();
        const b = pop();
        stack.push([pop(), b, c]);
        break;
      }
      case 0x74: // TUPLE
      case 0x6c: // LIST
        stack.push(popMark());
        break;
      case 0x5d: // EMPTY_LIST
        stack.push([]);
        break;
      case 0x8f: // EMPTY_SET
        stack.push([]);
        break;
      case 0x91: // FROZENSET
        stack.push(popMark());
        break;
      case 0x61: {
        // APPEND
        const v = pop();
        appendItems(top(), [v]);
        break;
      }
      case 0x65: // APPENDS
      case 0x90: {
        // ADDITEMS
        const items = popMark();
        appendItems(top(), items);
        break;
      }
      case 0x7d: // EMPTY_DICT
        stack.push(new Map());
        break;
      case 0x64: {
        // DICT
        const m = new Map();
        setItems(m, popMark());
        stack.push(m);
        break;
      }
      case 0x73: {
        // SETITEM
        const v = pop();
        const k = pop();
        setItems(top(), [k, v]);
        break;
      }
      case 0x75: {
        // SETITEMS
        const items = popMark();
        setItems(top(), items);
        break;
      }
      case 0x70: // PUT
        memo.set(Number(textInt(line())), top());
        break;
      case 0x71: // BINPUT
        memo.set(u8(), top());
        break;
      case 0x72: // LONG_BINPUT
        memo.set(u32(), top());
        break;
      case 0x94: // MEMOIZE
        memo.set(memo.size, top());
        break;
      case 0x67: // GET
        stack.push(memoGet(Number(textInt(line()))));
        break;
      case 0x68: // BINGET
        stack.push(memoGet(u8()));
        break;
      case 0x6a: // LONG_BINGET
        stack.push(memoGet(u32()));
        break;
      case 0x63: {
        // GLOBAL
        const module = line();
        stack.push(resolveGlobal(module, line()));
        break;
      }
      case 0x93: {
        // STACK_GLOBAL
        const name = pop();
        const module = pop();
        if (typeof module !== "string" || typeof name !== "string")
          fail("STACK_GLOBAL of non-strings");
        stack.push(resolveGlobal(module as string, name as string));
        break;
      }
      case 0x52: {
        // REDUCE
        const args = pop();
        if (!Array.isArray(args)) fail("REDUCE arguments are not a tuple");
        stack.push(call(pop(), args as unknown[]));
        break;
      }
      case 0x81: {
        // NEWOBJ: cls.__new__(cls, *args)
        const args = pop();
        const cls = pop();
        if (!Array.isArray(args) || !(cls instanceof PyGlobal)) fail("malformed NEWOBJ");
        stack.push(call(cls, args as unknown[]));
        break;
      }
      case 0x92: {
        // NEWOBJ_EX (keyword arguments are kept out of the record's args)
        pop();
        const args = pop();
        const cls = pop();
        if (!Array.isArray(args) || !(cls instanceof PyGlobal)) fail("malformed NEWOBJ_EX");
        stack.push(call(cls, args as unknown[]));
        break;
      }
      case 0x69: {
        // INST
        const module = line();
        const cls = resolveGlobal(module, line());
        stack.push(call(cls, popMark()));
        break;
      }
      case 0x6f: {
        // OBJ
        const items = popMark();
        const cls = items.shift();
        stack.push(call(cls, items));
        break;
      }
      case 0x62: {
        // BUILD: obj.__setstate__(state), recorded
        const state = pop();
        const obj = top();
        // Only records keep their state; on dicts (a state dict's `_metadata`) and on the
        // caller's values it carries nothing a conversion needs.
        if (obj instanceof PyObject) obj.state = state;
        else if (obj === null || typeof obj !== "object") fail("BUILD on a plain value");
        break;
      }
      case 0x50: // PERSID
        stack.push(hooks.persistentLoad(line()));
        break;
      case 0x51: // BINPERSID
        stack.push(hooks.persistentLoad(pop()));
        break;
      case 0x82: // EXT1
      case 0x83: // EXT2
      case 0x84: // EXT4
        fail("extension-registry opcodes (EXT*) are not supported");
        break;
      case 0x97: // NEXT_BUFFER
      case 0x98: // READONLY_BUFFER
        fail("out-of-band buffers (protocol 5) are not supported");
        break;
      default:
        fail(`unknown opcode 0x${op.toString(16).padStart(2, "0")}`);
    }
  }
}
