//! `GET /v1/models` and `GET /v1/models/{model}`.

use axum::extract::{Path, State};
use axum::Json;

use crate::error::ApiError;
use crate::openai_types::{ModelCard, ModelList};
use crate::state::AppState;

fn card(state: &AppState) -> ModelCard {
    let info = state.engine.info();
    ModelCard { id: info.id.clone(), object: "model", created: info.created, owned_by: "kvc", max_model_len: info.max_model_len }
}

pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList { object: "list", data: vec![card(&state)] })
}

pub async fn get_model(State(state): State<AppState>, Path(model): Path<String>) -> Result<Json<ModelCard>, ApiError> {
    state.check_model(Some(&model))?;
    Ok(Json(card(&state)))
}
