from portal.api.routers import OptionalSlashRouter
from scheduler.api import jobs, projects, views

router = OptionalSlashRouter()
router.register("projects", projects.ProjectViewSet, basename="api-project")
router.register("gpu-models", views.GpuModelViewSet, basename="api-gpu-model")
router.register("jobs", jobs.JobViewSet, basename="api-job")
router.register("job-templates", jobs.JobTemplateViewSet, basename="api-job-template")

urlpatterns = router.urls
