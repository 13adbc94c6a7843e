//! The output-schema subset (spec §2.10): the structural check a requested `outputSchema` must
//! pass before any child exists, and the validation of a captured structured value against it.
//!
//! The enforced subset:
//!
//! * every node is a JSON object; constraint keywords are `type`, `oneOf`, `properties`,
//!   `required`, `additionalProperties`, `items`, `enum`, `const`; annotation keywords are
//!   `description` and `title` (strings) and `default` and `examples` (lossless JSON);
//! * `type` is one string among `object`, `array`, `string`, `number`, `integer`, `boolean`,
//!   `null`;
//! * `properties`, `required` (strings naming declared properties) and boolean
//!   `additionalProperties` only on `object`; `items` (one schema) only on `array`;
//! * `enum` (non-empty, values of the scalar type) and `const` (one such value, a member of
//!   `enum` when both appear) only on scalar types; numbers finite and not negative zero,
//!   `integer` values integral;
//! * `oneOf`: at least two schemas, exclusive with `type`, and no
//!   `properties`/`required`/`additionalProperties`/`items`/`enum`/`const` beside it;
//! * a node with neither `type` nor `oneOf` is annotation-only ("any JSON") and carries no
//!   constraint keyword;
//! * for structured output the root must be `type: "object"`.
//!
//! Every violation is collected (in walk order, without recursion, so arbitrarily deep schemas
//! cannot exhaust the stack) and reported together in one `UNSUPPORTED_SCHEMA`
//! [`SubagentError`].

use serde_json::{Map, Number, Value};

use crate::error::SubagentError;

const CONSTRAINT_KEYWORDS: [&str; 8] = [
    "type",
    "oneOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
];
const ANNOTATION_KEYWORDS: [&str; 4] = ["description", "title", "default", "examples"];
const SCHEMA_TYPES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];
/// Constraint keywords that may not appear beside `oneOf` or on an annotation-only node.
const STRUCTURAL_KEYWORDS: [&str; 6] = [
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
];

/// Which schema types admit a type-restricted keyword.
fn allowed_types(keyword: &str) -> &'static [&'static str] {
    match keyword {
        "properties" | "required" | "additionalProperties" => &["object"],
        "items" => &["array"],
        _ => &["string", "number", "integer", "boolean", "null"],
    }
}

/// Deferred work of the stack-safe walk.
enum Task<'a> {
    Enter {
        node: &'a Value,
        path: String,
    },
    OneOfTail {
        node: &'a Map<String, Value>,
        path: String,
    },
    ObjectTail {
        node: &'a Map<String, Value>,
        path: String,
    },
}

/// A finite number that is not negative zero.
fn is_json_number(n: &Number) -> bool {
    match n.as_f64() {
        Some(f) => f.is_finite() && !(f == 0.0 && f.is_sign_negative()),
        None => false,
    }
}

fn is_integral(n: &Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

/// Whether `value` is a valid literal for scalar type `ty`.
fn scalar_matches(ty: &str, value: &Value) -> bool {
    match (ty, value) {
        ("string", Value::String(_)) | ("boolean", Value::Bool(_)) | ("null", Value::Null) => true,
        ("number", Value::Number(n)) => is_json_number(n),
        ("integer", Value::Number(n)) => is_json_number(n) && is_integral(n),
        _ => false,
    }
}

/// JSON equality of two scalars (numbers compare by value, so `1` equals `1.0`).
fn scalar_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        _ => a == b,
    }
}

/// A JSON value with no negative zero anywhere (the log's lossless-JSON rule).
fn is_lossless(value: &Value) -> bool {
    agent::session::check_lossless_json(value).is_ok()
}

fn check_object_tail(node: &Map<String, Value>, path: &str, out: &mut Vec<String>) {
    if let Some(required) = node.get("required") {
        match required.as_array() {
            Some(items) if items.iter().all(Value::is_string) => {
                let declared = node.get("properties").and_then(Value::as_object);
                for key in items.iter().filter_map(Value::as_str) {
                    if !declared.is_some_and(|d| d.contains_key(key)) {
                        out.push(format!(
                            "{path}.required names \"{key}\" which is not in properties"
                        ));
                    }
                }
            }
            _ => out.push(format!("{path}.required must be an array of strings")),
        }
    }
    if node.get("additionalProperties").is_some_and(|v| !v.is_boolean()) {
        out.push(format!("{path}.additionalProperties must be a boolean"));
    }
}

fn check_scalar(node: &Map<String, Value>, ty: &str, path: &str, out: &mut Vec<String>) {
    let declared_enum = node.get("enum");
    let valid_enum = declared_enum
        .and_then(Value::as_array)
        .filter(|items| !items.is_empty() && items.iter().all(|v| scalar_matches(ty, v)));
    if declared_enum.is_some() && valid_enum.is_none() {
        out.push(format!("{path}.enum must be a non-empty array of {ty} values"));
    }
    if let Some(constant) = node.get("const") {
        if !scalar_matches(ty, constant) {
            out.push(format!("{path}.const must be a {ty} value"));
        } else if let Some(items) = valid_enum
            && !items.iter().any(|v| scalar_eq(v, constant))
        {
            out.push(format!(
                "{path}.const must be one of {path}.enum when both are declared"
            ));
        }
    }
}

/// Walks one node; pushes its children (and tails) onto `tasks`.
fn enter<'a>(node: &'a Value, path: String, tasks: &mut Vec<Task<'a>>, out: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        out.push(format!("{path} must be a schema object"));
        return;
    };
    for (key, value) in map {
        if CONSTRAINT_KEYWORDS.contains(&key.as_str()) {
            continue;
        }
        if ANNOTATION_KEYWORDS.contains(&key.as_str()) {
            if !is_lossless(value) {
                out.push(format!("{path}.{key} annotation must be lossless JSON data"));
            }
            continue;
        }
        out.push(format!(
            "{path}.{key} is not a supported keyword (subset: \
             type/oneOf/properties/required/additionalProperties/items/enum/const + annotations)"
        ));
    }
    for key in ["description", "title"] {
        if map.get(key).is_some_and(|v| !v.is_string()) {
            out.push(format!("{path}.{key} must be a string"));
        }
    }

    let ty = map.get("type");
    let one_of = map.get("oneOf");
    match (ty, one_of) {
        (Some(_), Some(_)) => out.push(format!("{path} cannot declare both type and oneOf")),
        (None, None) => {
            for key in STRUCTURAL_KEYWORDS {
                if map.contains_key(key) {
                    out.push(format!("{path}.{key} requires type or oneOf"));
                }
            }
        }
        (None, Some(branches)) => {
            tasks.push(Task::OneOfTail {
                node: map,
                path: path.clone(),
            });
            match branches.as_array() {
                Some(items) if items.len() >= 2 => {
                    for (i, branch) in items.iter().enumerate().rev() {
                        tasks.push(Task::Enter {
                            node: branch,
                            path: format!("{path}.oneOf[{i}]"),
                        });
                    }
                }
                _ => out.push(format!("{path}.oneOf must be an array of at least two schemas")),
            }
        }
        (Some(ty), None) => {
            let Some(ty) = ty.as_str().filter(|t| SCHEMA_TYPES.contains(t)) else {
                out.push(if ty.is_array() {
                    format!("{path}.type must be a single type string (type arrays are not supported)")
                } else {
                    format!("{path}.type must be one of {}", SCHEMA_TYPES.join("/"))
                });
                return;
            };
            for key in STRUCTURAL_KEYWORDS {
                if map.contains_key(key) && !allowed_types(key).contains(&ty) {
                    out.push(format!("{path}.{key} is not supported on type \"{ty}\""));
                }
            }
            match ty {
                "object" => {
                    tasks.push(Task::ObjectTail {
                        node: map,
                        path: path.clone(),
                    });
                    if let Some(properties) = map.get("properties") {
                        match properties.as_object() {
                            Some(props) => {
                                for (key, child) in props.iter().rev() {
                                    tasks.push(Task::Enter {
                                        node: child,
                                        path: format!("{path}.properties.{key}"),
                                    });
                                }
                            }
                            None => out.push(format!("{path}.properties must be an object of schemas")),
                        }
                    }
                }
                "array" => {
                    if let Some(items) = map.get("items") {
                        tasks.push(Task::Enter {
                            node: items,
                            path: format!("{path}.items"),
                        });
                    }
                }
                scalar => check_scalar(map, scalar, &path, out),
            }
        }
    }
}

/// Every subset violation of `schema`, in walk order (empty = inside the subset). With
/// `object_root`, a schema that is otherwise valid must also have `type: "object"` at its root
/// and nest no deeper than [`MAX_OUTPUT_SCHEMA_DEPTH`] (within the bound [`validate_structured`]
/// judges values under, and loggable in the child's requests).
///
/// Never panics and never recurses, whatever the input.
pub fn schema_violations(schema: &Value, object_root: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut tasks = vec![Task::Enter {
        node: schema,
        path: "schema".to_owned(),
    }];
    while let Some(task) = tasks.pop() {
        match task {
            Task::Enter { node, path } => enter(node, path, &mut tasks, &mut out),
            Task::OneOfTail { node, path } => {
                for key in STRUCTURAL_KEYWORDS {
                    if node.contains_key(key) {
                        out.push(format!("{path}.{key} is not supported beside oneOf"));
                    }
                }
            }
            Task::ObjectTail { node, path } => check_object_tail(node, &path, &mut out),
        }
    }
    if object_root && out.is_empty() && schema.get("type").and_then(Value::as_str) != Some("object") {
        out.push("schema.type must be \"object\" (structured output is object-rooted)".to_owned());
    }
    // An output schema must also be usable by `validate_structured`, which refuses schemas
    // nested deeper than its bound: accepted, such a schema would start a child whose every
    // capture fails.
    if object_root && out.is_empty() && nesting_depth(schema) > MAX_OUTPUT_SCHEMA_DEPTH {
        out.push(format!(
            "schema nests deeper than {MAX_OUTPUT_SCHEMA_DEPTH} levels"
        ));
    }
    out
}

/// Asserts that `schema` lies inside the enforced subset (any root; an annotation-only root
/// means "any JSON"). Fails with one `UNSUPPORTED_SCHEMA` error listing every violation.
pub fn assert_supported_schema(schema: &Value) -> Result<(), SubagentError> {
    let violations = schema_violations(schema, false);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(SubagentError::unsupported_schema(&violations))
    }
}

/// Asserts that `schema` is an acceptable `outputSchema`: inside the subset **and** rooted at
/// `type: "object"` (spec §2.5 step 4). Fails with one `UNSUPPORTED_SCHEMA` error whose message
/// is `unsupported JSON schema: <v1>; <v2>; …`.
pub fn assert_output_schema(schema: &Value) -> Result<(), SubagentError> {
    let violations = schema_violations(schema, true);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(SubagentError::unsupported_schema(&violations))
    }
}

/// The deepest nesting [`validate_structured`] accepts in a schema or a value (the nesting
/// limit JSON parsers apply by default, so any value parsed from text fits).
pub const MAX_VALIDATION_DEPTH: usize = 128;

/// The deepest nesting an **output** schema may have: values must be judged under it
/// ([`MAX_VALIDATION_DEPTH`]), and the schema is also written into the child's log, as the
/// capture tool's parameters inside each `request/header` event, five levels below the top of
/// the line — and a log line nests at most 127 levels, the JSON reader's limit. A deeper schema
/// would start a child that can never log a request.
pub const MAX_OUTPUT_SCHEMA_DEPTH: usize = 120;

/// How deeply `value` nests (a scalar is 0), computed without recursion.
fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, depth + 1))),
            _ => {}
        }
    }
    deepest
}

/// The schema the validator compiles for a subset schema: the same constraints with every
/// annotation keyword removed and `required` deduplicated.
///
/// The subset accepts some annotations and `required` lists that the validator's meta-schema
/// (JSON Schema 2020-12) refuses — `examples` that is not an array, a property named twice in
/// `required` — although neither changes which values are valid. Compiling the schema verbatim
/// would make every value of such an accepted schema fail as "schema not usable", so a
/// structured run could never capture. Only called on schemas that passed
/// [`assert_output_schema`] and the nesting bound, so the recursion is bounded.
fn validation_schema(node: &Value) -> Value {
    let Some(map) = node.as_object() else {
        return node.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let value = match key.as_str() {
            k if ANNOTATION_KEYWORDS.contains(&k) => continue,
            "properties" => match value.as_object() {
                Some(props) => Value::Object(
                    props
                        .iter()
                        .map(|(name, child)| (name.clone(), validation_schema(child)))
                        .collect(),
                ),
                None => value.clone(),
            },
            "items" => validation_schema(value),
            "oneOf" => match value.as_array() {
                Some(branches) => Value::Array(branches.iter().map(validation_schema).collect()),
                None => value.clone(),
            },
            "required" => match value.as_array() {
                Some(names) => {
                    let mut seen = std::collections::HashSet::new();
                    Value::Array(
                        names
                            .iter()
                            .filter(|name| seen.insert(name.as_str()))
                            .cloned()
                            .collect(),
                    )
                }
                None => value.clone(),
            },
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

/// Why a structured value was refused by [`validate_structured`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StructuredValueError {
    /// The schema itself is unusable (outside the subset, not object-rooted, or rejected by the
    /// validator); the value was not examined.
    #[error(transparent)]
    Schema(SubagentError),
    /// The value does not satisfy the schema. Lists every violation, each prefixed with the
    /// JSON-pointer location of the offending part of the value (`value` is the root).
    #[error("structured value does not match the output schema: {}", violations.join("; "))]
    Invalid {
        /// The violations, in validator order.
        violations: Vec<String>,
    },
}

/// Validates a captured structured value against an output schema (spec §2.10, value
/// semantics): `additionalProperties: false` rejects undeclared keys (absent or `true` leaves
/// the object open); required keys must be present; `oneOf` needs exactly one matching branch;
/// the value must be lossless JSON (no negative zero).
///
/// The schema is first checked with [`assert_output_schema`]; a bad schema yields
/// [`StructuredValueError::Schema`]. Never panics.
pub fn validate_structured(schema: &Value, value: &Value) -> Result<(), StructuredValueError> {
    assert_output_schema(schema).map_err(StructuredValueError::Schema)?;
    // The validator walks recursively; bound both inputs so no input can exhaust the stack.
    if nesting_depth(schema) > MAX_VALIDATION_DEPTH {
        return Err(StructuredValueError::Schema(SubagentError::unsupported_schema(
            &[format!("schema nests deeper than {MAX_VALIDATION_DEPTH} levels")],
        )));
    }
    if nesting_depth(value) > MAX_VALIDATION_DEPTH {
        return Err(StructuredValueError::Invalid {
            violations: vec![format!("value nests deeper than {MAX_VALIDATION_DEPTH} levels")],
        });
    }
    let validator = jsonschema::validator_for(&validation_schema(schema)).map_err(|e| {
        StructuredValueError::Schema(SubagentError::unsupported_schema(&[format!(
            "schema is not usable for validation: {e}"
        )]))
    })?;
    let mut violations: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("value{}: {e}", e.instance_path()))
        .collect();
    if let Err(reason) = agent::session::check_lossless_json(value) {
        violations.push(format!("value must be lossless JSON: {reason}"));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(StructuredValueError::Invalid { violations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::SubagentErrorCode;
    use proptest::prelude::*;
    use serde_json::json;

    fn violations(schema: Value) -> Vec<String> {
        schema_violations(&schema, true)
    }

    /// spec: §2.10 — a non-object-root schema is rejected with `UNSUPPORTED_SCHEMA`.
    #[test]
    fn non_object_root_is_rejected() {
        for schema in [
            json!({"type": "string"}),
            json!({}),
            json!({"oneOf": [{"type": "object"}, {"type": "null"}]}),
        ] {
            let err = assert_output_schema(&schema).unwrap_err();
            assert_eq!(err.code(), SubagentErrorCode::UnsupportedSchema);
            assert_eq!(
                err.to_string(),
                "unsupported JSON schema: schema.type must be \"object\" (structured output is object-rooted)"
            );
            // The same schemas are inside the subset when any root is allowed.
            assert_supported_schema(&schema).unwrap();
        }
        let err = assert_output_schema(&json!("object")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported JSON schema: schema must be a schema object"
        );
    }

    #[test]
    fn accepted_subset_passes() {
        let schema = json!({
            "type": "object",
            "title": "Answer",
            "description": "the answer",
            "default": {"n": 1},
            "examples": [{"n": 2}],
            "additionalProperties": false,
            "required": ["n", "tags"],
            "properties": {
                "n": {"type": "integer", "enum": [1, 2, 3], "const": 2.0},
                "tags": {"type": "array", "items": {"type": "string"}},
                "any": {"description": "any JSON"},
                "choice": {"oneOf": [{"type": "string"}, {"type": "null", "const": null}]},
                "flag": {"type": "boolean", "enum": [true]},
                "ratio": {"type": "number", "enum": [0.5, 1]},
            }
        });
        assert_eq!(violations(schema.clone()), Vec::<String>::new());
        assert_output_schema(&schema).unwrap();
    }

    /// spec: §2.10 — every rejected construct is reported, all together, with pinned texts.
    #[test]
    fn every_violation_is_collected_with_pinned_texts() {
        let schema = json!({
            "type": "object",
            "$ref": "#/x",
            "description": 7,
            "properties": {
                "a": {"type": ["string", "null"]},
                "b": {"type": "string", "pattern": "x", "minLength": 1},
                "c": {"type": "strin"},
                "d": {"type": "string", "items": {"type": "string"}},
                "e": {"type": "string", "enum": []},
                "f": {"type": "integer", "enum": [1.5]},
                "g": {"type": "string", "const": 3},
                "h": {"type": "string", "enum": ["x"], "const": "y"},
                "i": {"oneOf": [{"type": "string"}]},
                "j": {"oneOf": [{"type": "string"}, {"type": "number"}], "enum": [1], "type": "string"},
                "k": {"oneOf": [{"type": "string"}, {"type": "number"}], "required": []},
                "l": {"enum": [1]},
                "m": {"type": "object", "additionalProperties": {}, "required": ["zz"]},
                "n": {"type": "object", "required": "x", "properties": []},
                "o": 5,
                "p": {"anyOf": [], "allOf": [], "not": {}, "format": "date", "minimum": 0, "patternProperties": {}, "prefixItems": []},
                "q": {"type": "number", "enum": [-0.0]},
                "r": {"title": ["x"], "default": -0.0},
            },
            "required": ["a", "missing"],
        });
        let got = violations(schema);
        insta::assert_snapshot!(got.join("\n"));
    }

    /// spec: §2.10 — a non-lossless annotation is rejected with `annotation must be lossless
    /// JSON data`.
    #[test]
    fn annotation_must_be_lossless() {
        let err = assert_output_schema(&json!({"type": "object", "default": {"x": -0.0}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported JSON schema: schema.default annotation must be lossless JSON data"
        );
    }

    /// spec: §2.10 — an out-of-subset schema rejects with `unsupported JSON schema`.
    #[test]
    fn out_of_subset_schema_message() {
        let err = assert_output_schema(&json!({"type": "object", "minProperties": 1})).unwrap_err();
        assert!(err.to_string().starts_with("unsupported JSON schema: "), "{err}");
        assert_eq!(err.code(), SubagentErrorCode::UnsupportedSchema);
    }

    #[test]
    fn deep_schemas_do_not_exhaust_the_stack() {
        let mut schema = json!({"type": "string"});
        // Built by moving values (never `json!` with a nested value, which re-serializes it
        // recursively).
        for _ in 0..4_000 {
            let mut node = Map::new();
            node.insert("type".into(), json!("array"));
            node.insert("items".into(), schema);
            schema = Value::Object(node);
        }
        let mut properties = Map::new();
        properties.insert("deep".into(), schema);
        let mut root = Map::new();
        root.insert("type".into(), json!("object"));
        root.insert("properties".into(), Value::Object(properties));
        let root = Value::Object(root);
        // The walk itself is inside the subset; as an output schema it is refused for its depth.
        assert!(schema_violations(&root, false).is_empty());
        assert_eq!(
            schema_violations(&root, true),
            vec!["schema nests deeper than 120 levels".to_owned()]
        );
        // Value validation refuses such a schema with a typed error instead of recursing.
        let Err(StructuredValueError::Schema(err)) = validate_structured(&root, &json!({})) else {
            panic!("a too-deep schema must be refused");
        };
        assert!(err.to_string().contains("nests deeper than 120 levels"), "{err}");
        // serde_json drops nested values recursively; leak this deliberately deep test value
        // instead of letting its drop overflow the test thread's stack.
        std::mem::forget(root);
    }

    /// An object-rooted schema `depth` levels deep: `{"type": "object", "properties": {"deep":
    /// <arrays of arrays … of strings>}}`.
    fn nested_output_schema(depth: usize) -> Value {
        let mut schema = json!({"type": "string"});
        // The root's `properties` map, the `deep` node and the innermost node's `type` value
        // are three levels; each array node adds one.
        for _ in 0..depth - 3 {
            let mut node = Map::new();
            node.insert("type".into(), json!("array"));
            node.insert("items".into(), schema);
            schema = Value::Object(node);
        }
        json!({"type": "object", "properties": {"deep": schema}})
    }

    /// spec: §2.10 — an output schema is accepted only when values can be judged under it and
    /// the child can log it: one nested exactly to the output bound is accepted and validates values, one level more is
    /// refused with `UNSUPPORTED_SCHEMA` at the assertion (not accepted and then refused at every
    /// capture).
    #[test]
    fn output_schemas_nested_past_the_validation_bound_are_refused() {
        let at_bound = nested_output_schema(MAX_OUTPUT_SCHEMA_DEPTH);
        assert_eq!(nesting_depth(&at_bound), MAX_OUTPUT_SCHEMA_DEPTH);
        assert_output_schema(&at_bound).unwrap();
        validate_structured(&at_bound, &json!({})).unwrap();
        validate_structured(&at_bound, &json!({"deep": [[]]})).unwrap();
        assert!(matches!(
            validate_structured(&at_bound, &json!({"deep": ["x"]})),
            Err(StructuredValueError::Invalid { .. })
        ));

        let past = nested_output_schema(MAX_OUTPUT_SCHEMA_DEPTH + 1);
        assert_eq!(nesting_depth(&past), MAX_OUTPUT_SCHEMA_DEPTH + 1);
        let err = assert_output_schema(&past).unwrap_err();
        assert_eq!(err.code(), SubagentErrorCode::UnsupportedSchema);
        assert_eq!(
            err.to_string(),
            "unsupported JSON schema: schema nests deeper than 120 levels"
        );
        // Still inside the subset where any root is allowed (no value validation there).
        assert_supported_schema(&past).unwrap();
    }

    #[test]
    fn structured_values_follow_value_semantics() {
        let schema = json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "n": {"type": "integer"},
                "pick": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            }
        });
        validate_structured(&schema, &json!({"name": "x", "n": 2, "pick": 3})).unwrap();
        let Err(StructuredValueError::Invalid { violations }) =
            validate_structured(&schema, &json!({"n": 1.5, "extra": true}))
        else {
            panic!("expected violations");
        };
        assert!(violations.len() >= 3, "{violations:?}");
        assert!(violations.iter().any(|v| v.contains("name")), "{violations:?}");
        assert!(violations.iter().any(|v| v.contains("extra")), "{violations:?}");
        assert!(
            violations.iter().any(|v| v.starts_with("value/n")),
            "{violations:?}"
        );
        // Open objects accept undeclared keys.
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        validate_structured(&open, &json!({"b": 1})).unwrap();
        // Negative zero is not lossless.
        let any = json!({"type": "object"});
        assert!(matches!(
            validate_structured(&any, &json!({"z": -0.0})),
            Err(StructuredValueError::Invalid { .. })
        ));
        // A bad schema is a typed error, not a panic.
        let err = validate_structured(&json!({"type": "object", "pattern": "("}), &json!({})).unwrap_err();
        let StructuredValueError::Schema(err) = err else {
            panic!("schema error expected")
        };
        assert_eq!(err.code(), SubagentErrorCode::UnsupportedSchema);
    }

    /// spec: §2.10 (seam) — annotations take any lossless JSON and `required` only has to name
    /// declared properties: schemas the subset accepts but JSON Schema's meta-schema refuses
    /// (non-array `examples`, a repeated `required` name) still validate values, so a structured
    /// run with such a schema can capture.
    #[test]
    fn accepted_schemas_outside_the_meta_schema_still_validate() {
        for schema in [
            json!({"type": "object", "examples": 5, "properties": {"a": {"type": "string", "examples": {"x": 1}}}}),
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]}),
            json!({"type": "object", "properties": {"a": {"oneOf": [
                {"type": "object", "properties": {"b": {"type": "null"}}, "required": ["b", "b"]},
                {"type": "string", "examples": "s"}
            ]}}}),
        ] {
            assert_output_schema(&schema).unwrap();
            validate_structured(&schema, &json!({"a": "x"})).unwrap();
            let Err(StructuredValueError::Invalid { violations }) =
                validate_structured(&schema, &json!({"a": 1}))
            else {
                panic!("{schema}: a mismatching value is an Invalid error, not a Schema error");
            };
            assert!(
                violations.iter().any(|v| v.starts_with("value/a")),
                "{violations:?}"
            );
        }
        // A property named like an annotation keyword keeps its schema.
        let schema = json!({"type": "object", "properties": {"examples": {"type": "integer"}}, "required": ["examples"]});
        validate_structured(&schema, &json!({"examples": 1})).unwrap();
        assert!(validate_structured(&schema, &json!({"examples": "no"})).is_err());
        assert!(validate_structured(&schema, &json!({})).is_err());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            prop::sample::select(vec![
                "object",
                "array",
                "string",
                "number",
                "integer",
                "boolean",
                "null",
                "x",
                "type",
                "oneOf",
                "properties",
                "required",
                "items",
                "enum",
                "const",
                "additionalProperties",
                "description",
            ])
            .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(6, 96, 6, |inner| {
            let keys = prop::sample::select(vec![
                "type",
                "oneOf",
                "properties",
                "required",
                "additionalProperties",
                "items",
                "enum",
                "const",
                "description",
                "title",
                "default",
                "examples",
                "$ref",
                "a",
                "b",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((keys, inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        })
    }

    proptest! {
        /// The subset check never panics on arbitrary JSON, and an accepted object-rooted
        /// schema can always be compiled and used for value validation without panicking.
        #[test]
        fn subset_check_never_panics(schema in arb_json(), value in arb_json()) {
            let v = schema_violations(&schema, true);
            let _ = assert_supported_schema(&schema);
            let validated = validate_structured(&schema, &value);
            if v.is_empty() {
                prop_assert!(assert_output_schema(&schema).is_ok());
                // An accepted schema is always usable: values are judged, never the schema.
                prop_assert!(
                    !matches!(validated, Err(StructuredValueError::Schema(_))),
                    "{schema} accepted but {validated:?}"
                );
            }
        }
    }
}
