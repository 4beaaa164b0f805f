//! Strict JSON: a struct is read from a JSON object only, never from an array of its fields.
//!
//! serde's derived `Deserialize` of a struct also accepts a sequence, its fields by position, so
//! `"fault": [2, 1, "panic"]` would read as a fault of rank 2 at step 1. A hand-written file
//! must never be read by position. [`Strict`] wraps a deserializer (serde_json's, or a
//! `serde_json::Value`) and everything it hands on (visitors, seeds, sequence, map and enum
//! accesses), recursively, as `serde_path_to_error` does; its `deserialize_struct` (and an enum's
//! struct variant) refuses a sequence with "expected an object, got an array" before the
//! struct's visitor sees it. One wrapper covers every struct at every depth of every type read
//! through it: scenario files and every kind's `params` (built-in or a user's, through
//! `ScenarioSpec::parse_params`), checkpoint JSON and lock files ([`from_slice`],
//! [`from_value`], which also name the field of an error).
//!
//! Determinism: a pure function of the bytes; it only refuses, it changes no value it passes on.
//!
//! Limits: serde reads an internally tagged or untagged enum, and a `flatten`ed field, through
//! `deserialize_any` into a buffer, where a struct is no longer visible as one; such a field
//! takes `#[serde(deserialize_with = "crate::file::strict::object")]`, which asks for a map
//! itself (train's `optimizer`).

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};
use serde::Deserialize;
use std::fmt;

/// What a struct given as an array is told.
const EXPECTED_OBJECT: &str = "expected an object, got an array (fields are read by name)";

/// Reads `T` from JSON bytes, structs from objects only, naming the field of an error (its
/// path, `.` for the top level) and refusing trailing bytes.
pub(crate) fn from_slice<T: de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(Strict(&mut json))?;
    json.end().map_err(|e| {
        serde_path_to_error::Error::new(serde_path_to_error::Track::new().path(), e)
    })?;
    Ok(value)
}

/// Reads `T` from a JSON value, structs from objects only, naming the field of an error.
pub(crate) fn from_value<T: de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(Strict(value))
}

/// A `deserialize_with` for a type serde reads through `deserialize_any` (an internally tagged
/// enum): from a JSON object only, its entries handed on as they are (so paths and the
/// strictness of the deserializer carry on).
pub(crate) fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct MapOnly<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<T, A::Error> {
            Err(de::Error::custom(EXPECTED_OBJECT))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }
    // Through `any`, so an array is seen (and told as the wrapper tells it), not refused by
    // the deserializer in its own words.
    deserializer.deserialize_any(MapOnly(std::marker::PhantomData))
}

/// The wrapper: around a deserializer, a seed, or a sequence, map or enum access, each handing
/// on only wrapped parts.
pub(crate) struct Strict<T>(pub(crate) T);

/// Around a visitor: `object_only` when it is a struct's (a sequence is then refused).
struct StrictVisitor<V> {
    visitor: V,
    object_only: bool,
}

impl<V> StrictVisitor<V> {
    fn any(visitor: V) -> Self {
        StrictVisitor {
            visitor,
            object_only: false,
        }
    }
}

/// `deserialize_*` methods that take only a visitor, handed on with it wrapped.
macro_rules! forward_deserialize {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(StrictVisitor::any(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0
            .deserialize_unit_struct(name, StrictVisitor::any(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0
            .deserialize_newtype_struct(name, StrictVisitor::any(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, StrictVisitor::any(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0
            .deserialize_tuple_struct(name, len, StrictVisitor::any(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = StrictVisitor {
            visitor,
            object_only: true,
        };
        self.0.deserialize_struct(name, fields, visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0
            .deserialize_enum(name, variants, StrictVisitor::any(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// `visit_*` methods of one scalar argument, handed on as they are.
macro_rules! forward_visit {
    ($($method:ident($ty:ty))*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.visitor.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for StrictVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    forward_visit! {
        visit_bool(bool) visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64)
        visit_i128(i128) visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64)
        visit_u128(u128) visit_f32(f32) visit_f64(f64) visit_char(char) visit_str(&str)
        visit_borrowed_str(&'de str) visit_string(String) visit_bytes(&[u8])
        visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Strict(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(Strict(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        if self.object_only {
            return Err(de::Error::custom(EXPECTED_OBJECT));
        }
        self.visitor.visit_seq(Strict(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Strict(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Strict(data))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Strict<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(deserializer))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Strict<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Strict(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Strict<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Strict(seed))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(Strict(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Strict<A> {
    type Error = A::Error;
    type Variant = Strict<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(Strict(seed))?;
        Ok((value, Strict(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Strict<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        self.0.newtype_variant_seed(Strict(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, StrictVisitor::any(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let visitor = StrictVisitor {
            visitor,
            object_only: true,
        };
        self.0.struct_variant(fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
        #[serde(default)]
        b: String,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Shape {
        Point,
        Size(u32),
        Pair(u32, u32),
        Rect { w: u32, h: u32 },
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        inner: Option<Inner>,
        #[serde(default)]
        list: Vec<Inner>,
        #[serde(default)]
        tuple: Option<(u32, Inner)>,
        #[serde(default)]
        by_name: BTreeMap<String, Inner>,
        #[serde(default)]
        shapes: Vec<Shape>,
        #[serde(default)]
        boxed: Option<Box<Inner>>,
    }

    fn read(text: &str) -> Result<Outer, String> {
        from_slice::<Outer>(text.as_bytes()).map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn objects_read_as_serde_reads_them() {
        let outer = read(
            r#"{"inner": {"a": 1}, "list": [{"a": 2, "b": "x"}], "tuple": [3, {"a": 4}],
                "by_name": {"k": {"a": 5}}, "boxed": {"a": 6},
                "shapes": ["point", {"size": 7}, {"pair": [8, 9]}, {"rect": {"w": 1, "h": 2}}]}"#,
        )
        .unwrap();
        assert_eq!(outer.inner, Some(Inner { a: 1, b: "".into() }));
        assert_eq!(outer.list[0].b, "x");
        assert_eq!(outer.tuple.as_ref().unwrap().1.a, 4);
        assert_eq!(outer.by_name["k"].a, 5);
        assert_eq!(outer.boxed.unwrap().a, 6);
        assert_eq!(
            outer.shapes,
            [
                Shape::Point,
                Shape::Size(7),
                Shape::Pair(8, 9),
                Shape::Rect { w: 1, h: 2 }
            ]
        );
        // The same through a `Value`.
        let value = serde_json::json!({"inner": {"a": 1, "b": "y"}, "shapes": [{"rect": {"w": 3, "h": 4}}]});
        let outer: Outer = from_value(value).unwrap();
        assert_eq!(outer.inner.unwrap().b, "y");
        assert_eq!(outer.shapes, [Shape::Rect { w: 3, h: 4 }]);
    }

    #[test]
    fn a_struct_given_as_an_array_is_refused_at_every_depth_naming_the_field() {
        // What serde's derive alone accepts, by position.
        for (text, field) in [
            (r#"[null, [], null, {}, [], null]"#, "."),
            (r#"{"inner": [1, "x"]}"#, "inner"),
            (r#"{"inner": [1]}"#, "inner"),
            (r#"{"list": [{"a": 1}, [2]]}"#, "list[1]"),
            (r#"{"tuple": [3, [4]]}"#, "tuple[1]"),
            (r#"{"by_name": {"k": [5]}}"#, "by_name.k"),
            (r#"{"boxed": [6]}"#, "boxed"),
            (r#"{"shapes": [{"rect": [1, 2]}]}"#, "shapes[0].rect"),
        ] {
            assert!(
                serde_json::from_str::<Outer>(text).is_ok(),
                "serde alone refuses {text}: the case tests nothing"
            );
            let err = read(text).unwrap_err();
            assert!(
                err.starts_with(&format!("{field}: expected an object, got an array")),
                "{text}: {err}"
            );
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let err = from_value::<Outer>(value).unwrap_err();
            assert_eq!(err.path().to_string(), field, "{text}");
        }
    }

    #[test]
    fn sequences_and_tuples_stay_sequences() {
        assert_eq!(from_slice::<Vec<u32>>(b"[1, 2]").unwrap(), [1, 2]);
        assert_eq!(from_slice::<(u32, String)>(br#"[1, "a"]"#).unwrap().1, "a");
        assert!(from_slice::<Vec<u32>>(b"[1] x").is_err(), "trailing bytes");
    }

    #[test]
    fn object_refuses_an_array_for_a_type_read_through_any() {
        #[derive(Debug, PartialEq, Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum Tagged {
            Sgd { lr: f32 },
        }
        #[derive(Debug, Deserialize)]
        struct Holder {
            #[serde(deserialize_with = "object")]
            tagged: Tagged,
        }
        // serde reads a tagged enum from an array, the tag first.
        assert!(serde_json::from_str::<Tagged>(r#"["sgd", 0.5]"#).is_ok());
        let read = |text: &str| from_slice::<Holder>(text.as_bytes());
        assert_eq!(
            read(r#"{"tagged": {"kind": "sgd", "lr": 0.5}}"#)
                .unwrap()
                .tagged,
            Tagged::Sgd { lr: 0.5 }
        );
        let err = read(r#"{"tagged": ["sgd", 0.5]}"#).unwrap_err();
        assert_eq!(err.path().to_string(), "tagged");
        assert!(
            err.inner().to_string().starts_with(EXPECTED_OBJECT),
            "{err}"
        );
    }
}
