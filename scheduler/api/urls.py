from portal.api.routers import OptionalSlashRouter
from scheduler.api import jobs, views

router = OptionalSlashRouter()
router.register("gpu-models", views.GpuModelViewSet, basename="api-gpu-model")
router.register("jobs", jobs.JobViewSet, basename="api-job")

urlpatterns = router.urls
