import type { SchemaElement } from "hyparquet";

/** A UTF-8 string column or field. */
export function string(
  name: string,
  repetition: "REQUIRED" | "OPTIONAL" = "REQUIRED",
): SchemaElement {
  return {
    name,
    type: "BYTE_ARRAY",
    converted_type: "UTF8",
    logical_type: { type: "STRING" },
    repetition_type: repetition,
  };
}

export function int64(name: string): SchemaElement {
  return { name, type: "INT64", repetition_type: "REQUIRED" };
}

export function boolean(name: string): SchemaElement {
  return { name, type: "BOOLEAN", repetition_type: "REQUIRED" };
}

export function struct(name: string, fields: SchemaElement[][]): SchemaElement[] {
  return [{ name, repetition_type: "REQUIRED", num_children: fields.length }, ...fields.flat()];
}

/** The standard 3-level LIST: `<name>` (LIST) → repeated `list` → `element`. */
export function list(name: string, element: SchemaElement[]): SchemaElement[] {
  return [
    {
      name,
      repetition_type: "REQUIRED",
      converted_type: "LIST",
      logical_type: { type: "LIST" },
      num_children: 1,
    },
    { name: "list", repetition_type: "REPEATED", num_children: 1 },
    ...element,
  ];
}

/** A file's schema from its top-level columns. */
export function rootSchema(columns: SchemaElement[][]): SchemaElement[] {
  return [{ name: "root", num_children: columns.length }, ...columns.flat()];
}

/** A chat prompt column: list<struct<role, content>>. */
export const promptColumn = (): SchemaElement[] =>
  list("prompt", struct("element", [[string("role")], [string("content")]]));

/** Search-R1's reward_model column: struct<style, ground_truth<target list<string>>>. */
export const rewardModelColumn = (): SchemaElement[] =>
  struct("reward_model", [[string("style")], groundTruth()]);

export const groundTruth = (): SchemaElement[] =>
  struct("ground_truth", [list("target", [string("element")])]);
