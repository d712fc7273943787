"""/v1/files and /v1/batches: async views over inference.batch_api.service (the ORM work runs
on the front door's database pool)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from inference.batch_api import service
from inference.batch_api.models import BatchFile
from inference.openai_api.db import in_db_thread
from inference.openai_api.errors import bad_request
from inference.openai_api.jobs import authenticate
from inference.openai_api.views import authorization, json_body, openai_view

DEFAULT_PAGE = 20
MAX_PAGE = 100


def _upload(authorization_header: str, request: HttpRequest) -> dict:
    tenant = authenticate(authorization_header)
    upload = request.FILES.get("file")
    if upload is None:
        raise bad_request("a multipart 'file' field is required.", "file")
    created = service.create_file(
        tenant=tenant,
        purpose=request.POST.get("purpose", ""),
        filename=upload.name or "",
        content=upload.read(),
    )
    return service.file_object(created)


def _list_files(authorization_header: str) -> list[dict]:
    tenant = authenticate(authorization_header)
    files = BatchFile.objects.filter(tenant=tenant).defer("content")[:MAX_PAGE]
    return [service.file_object(file) for file in files]


@openai_view("GET", "POST")
async def files(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return JsonResponse(await in_db_thread(_upload, authorization(request), request))
    data = await in_db_thread(_list_files, authorization(request))
    return JsonResponse({"object": "list", "data": data, "has_more": False})


def _file(authorization_header: str, file_id: str) -> dict:
    return service.file_object(service.get_file(authenticate(authorization_header), file_id))


def _file_content(authorization_header: str, file_id: str) -> bytes:
    return bytes(service.get_file(authenticate(authorization_header), file_id).content)


@openai_view("GET")
async def file_detail(request: HttpRequest, file_id: str) -> HttpResponse:
    return JsonResponse(await in_db_thread(_file, authorization(request), file_id))


@openai_view("GET")
async def file_content(request: HttpRequest, file_id: str) -> HttpResponse:
    content = await in_db_thread(_file_content, authorization(request), file_id)
    return HttpResponse(content, content_type="application/jsonl")


def _create_batch(authorization_header: str, body: object) -> dict:
    tenant = authenticate(authorization_header)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object.")
    batch = service.create_batch(
        tenant=tenant,
        input_file_id=body.get("input_file_id"),
        endpoint=body.get("endpoint"),
        completion_window=body.get("completion_window"),
        metadata=body.get("metadata"),
    )
    return service.batch_object(batch)


def _list_batches(authorization_header: str, after: str | None, limit: int) -> dict:
    tenant = authenticate(authorization_header)
    page, has_more = service.list_batches(tenant, after=after, limit=limit)
    data = [service.batch_object(batch) for batch in page]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _page_limit(request: HttpRequest) -> int:
    try:
        limit = int(request.GET.get("limit", DEFAULT_PAGE))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise bad_request(f"limit must be an integer from 1 to {MAX_PAGE}.", "limit")
    return limit


@openai_view("GET", "POST")
async def batches(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        body = json_body(request)
        return JsonResponse(await in_db_thread(_create_batch, authorization(request), body))
    answer = await in_db_thread(
        _list_batches, authorization(request), request.GET.get("after"), _page_limit(request)
    )
    return JsonResponse(answer)


def _batch(authorization_header: str, batch_id: str) -> dict:
    return service.batch_object(service.get_batch(authenticate(authorization_header), batch_id))


def _cancel(authorization_header: str, batch_id: str) -> dict:
    return service.batch_object(service.cancel_batch(authenticate(authorization_header), batch_id))


@openai_view("GET")
async def batch_detail(request: HttpRequest, batch_id: str) -> HttpResponse:
    return JsonResponse(await in_db_thread(_batch, authorization(request), batch_id))


@openai_view("POST")
async def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    return JsonResponse(await in_db_thread(_cancel, authorization(request), batch_id))
