//! Enums given by name on the command line go by the names they have in
//! JSON (serde's); any other name is an error that lists them.

/// `FromStr` for `$ty`, an enum of unit variants, by its serde names;
/// `$what` and `$names` make the error: `unknown api "x" (completions, chat)`.
macro_rules! from_str_by_serde_name {
    ($ty:ty, $what:literal, $names:literal) => {
        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> std::result::Result<Self, String> {
                serde_json::from_value(serde_json::Value::String(s.to_string()))
                    .map_err(|_| format!(concat!("unknown ", $what, " {:?} (", $names, ")"), s))
            }
        }
    };
}
pub(crate) use from_str_by_serde_name;

#[cfg(test)]
mod tests {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Shape {
        Round,
        Square,
    }
    from_str_by_serde_name!(Shape, "shape", "round, square");

    #[test]
    fn names_are_the_json_names_and_others_are_refused_with_the_list() {
        assert_eq!(("round".parse(), "square".parse()), (Ok(Shape::Round), Ok(Shape::Square)));
        assert_eq!("Round".parse::<Shape>(), Err("unknown shape \"Round\" (round, square)".to_string()));
        assert_eq!(" square".parse::<Shape>(), Err("unknown shape \" square\" (round, square)".to_string()));
    }
}
