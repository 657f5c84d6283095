"""/v1/models: the ids served now (base models and their adapters), in the caller's scope."""

from fastapi import APIRouter, Request

from lora_openai.auth import caller_of
from lora_openai.front import front_of

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request):
    return await front_of(request).catalog.openai_list(caller_of(request).scope)


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str):
    scope = caller_of(request).scope
    catalog = front_of(request).catalog
    for item in (await catalog.openai_list(scope))["data"]:
        if item["id"] == model_id:
            return item
    raise await catalog.not_found(model_id, scope)
