"""Base classes of the API's DRF views: what every endpoint answers the same way.

- A method the view does not implement is a 405 (in the API's error shape, with `Allow`
  naming the methods the view has) before anything else. DRF authenticates and checks
  permissions first, so TRACE, or PUT on a list, was answered 401 or 403.
- OPTIONS answers 204 with `Allow`. DRF's default describes the view's serializer as
  JSON, which for these views names the wrong fields (their request bodies are other
  serializers: the OpenAPI schema at /v1/schema/ is the description) and fails with a
  500 on a PUT or PATCH view with no queryset.
"""

from rest_framework import generics, status, views
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.response import Response


class HttpMethodsMixin:
    def perform_authentication(self, request):
        method = request.method.lower()
        if method not in self.http_method_names or not hasattr(self, method):
            raise MethodNotAllowed(request.method)
        super().perform_authentication(request)

    def options(self, request, *args, **kwargs):
        return Response(status=status.HTTP_204_NO_CONTENT)


class APIView(HttpMethodsMixin, views.APIView):
    pass


class GenericAPIView(HttpMethodsMixin, generics.GenericAPIView):
    pass
